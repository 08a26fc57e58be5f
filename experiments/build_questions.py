"""Build the labelled question set ``experiments/data/factual_prompts.jsonl`` from the facts below.

    python -m experiments.build_questions [--out PATH]

Deterministic: the facts are written here, arithmetic items come from a seeded generator,
and the order is fixed, so rerunning the command rewrites the same file. One JSON object
per line: ``{"prompt", "answers", "kind", "subject"}``. ``answers`` lists the aliases
accepted as correct (matching rule: :func:`experiments.factual_prompts.is_correct`);
``subject`` names the entity asked about, so questions about the same thing (a country's
capital, currency, language and continent) can be kept in one cross-validation fold.

Kinds: capital, continent, language, currency (one table of countries), chemical_symbol,
author, year, arithmetic, opposite, animal_young, general; added for leave-one-kind-out
evaluation (issue 37): city_country, landmark_city, plural, past_tense, sport, french_word,
animal_sound, company_country, nationality, colour; and ``invented``: the same question
forms about entities that do not exist (made-up countries, cities, landmarks, books,
elements, events, animals, words, athletes, companies, people), whose answer list is empty:
the only correct answer declines (:func:`experiments.factual_prompts.is_correct_answer`).
Plurals and past tenses get no invented subjects (a made-up word has both by rule).
No question repeats an example of the few-shot preamble (:data:`FEW_SHOT`).
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from experiments.factual_prompts import DATA_FILE, FEW_SHOT

# country | capital aliases | continent aliases | language aliases | currency aliases ("-": not asked)
# The name carries its article where English uses one ("the Netherlands").
COUNTRIES = """\
France|Paris|Europe|French|euro
Germany|Berlin|Europe|German|euro
Spain|Madrid|Europe|Spanish/Castilian|euro
Portugal|Lisbon|Europe|Portuguese|euro
Italy|-|Europe|Italian|euro
the United Kingdom|London|Europe|English|pound/pound sterling/British pound/sterling/GBP
Ireland|Dublin|Europe|English/Irish|euro
the Netherlands|Amsterdam|Europe|Dutch|euro
Belgium|Brussels|Europe|Dutch/French/Flemish/German|euro
Switzerland|Bern/Berne|Europe|German/French/Italian/Romansh|Swiss franc/franc/CHF
Austria|Vienna|Europe|German/Austrian German|euro
Poland|Warsaw|Europe|Polish|zloty/Polish zloty
the Czech Republic|Prague|Europe|Czech|koruna/Czech koruna/crown/Czech crown
Slovakia|Bratislava|Europe|Slovak|euro
Slovenia|Ljubljana|Europe|Slovene/Slovenian|euro
Hungary|Budapest|Europe|Hungarian/Magyar|forint/Hungarian forint
Greece|Athens|Europe|Greek|euro
Sweden|Stockholm|Europe|Swedish|krona/Swedish krona
Norway|Oslo|Europe|Norwegian|krone/Norwegian krone
Denmark|Copenhagen|Europe|Danish|krone/Danish krone
Finland|Helsinki|Europe|Finnish/Swedish|euro
Iceland|Reykjavik|Europe|Icelandic|krona/Icelandic krona
Russia|Moscow|Europe/Asia|Russian|ruble/rouble/Russian ruble
Ukraine|Kyiv/Kiev|Europe|Ukrainian|hryvnia/hryvna
Belarus|Minsk|Europe|Belarusian/Russian|ruble/rouble/Belarusian ruble
Romania|Bucharest|Europe|Romanian|leu/Romanian leu
Bulgaria|Sofia|Europe|Bulgarian|lev/Bulgarian lev
Serbia|Belgrade|Europe|Serbian|dinar/Serbian dinar
Croatia|Zagreb|Europe|Croatian|euro/kuna
Albania|Tirana|Europe|Albanian|lek
Latvia|Riga|Europe|Latvian|euro
Lithuania|Vilnius|Europe|Lithuanian|euro
Estonia|Tallinn|Europe|Estonian|euro
Turkey|Ankara|Asia/Europe|Turkish|lira/Turkish lira
Armenia|Yerevan|Asia/Europe|Armenian|dram/Armenian dram
Azerbaijan|Baku|Asia/Europe|Azerbaijani/Azeri|manat
Egypt|Cairo|Africa|Arabic|pound/Egyptian pound
Morocco|Rabat|Africa|Arabic/Berber/Amazigh|dirham/Moroccan dirham
Algeria|Algiers|Africa|Arabic/Berber|dinar/Algerian dinar
Tunisia|Tunis|Africa|Arabic|dinar/Tunisian dinar
Libya|Tripoli|Africa|Arabic|dinar/Libyan dinar
Sudan|Khartoum|Africa|Arabic/English|pound/Sudanese pound
Ethiopia|Addis Ababa|Africa|Amharic|birr
Kenya|Nairobi|Africa|Swahili/English|shilling/Kenyan shilling
Uganda|Kampala|Africa|English/Swahili|shilling/Ugandan shilling
Tanzania|Dodoma|Africa|Swahili/English|shilling/Tanzanian shilling
Somalia|Mogadishu|Africa|Somali/Arabic|shilling/Somali shilling
Nigeria|Abuja|Africa|English|naira
Ghana|Accra|Africa|English|cedi/Ghanaian cedi
Senegal|Dakar|Africa|French/Wolof|CFA franc/franc/West African CFA franc
Angola|Luanda|Africa|Portuguese|kwanza
Zambia|Lusaka|Africa|English|kwacha/Zambian kwacha
Zimbabwe|Harare|Africa|English/Shona/Ndebele|-
Madagascar|Antananarivo|Africa|Malagasy/French|ariary
South Africa|Pretoria/Cape Town/Bloemfontein|Africa|English/Afrikaans/Zulu/Xhosa|rand/South African rand
Japan|Tokyo|Asia|Japanese|yen/Japanese yen
China|Beijing/Peking|Asia|Chinese/Mandarin/Standard Chinese/Mandarin Chinese|yuan/renminbi/Chinese yuan/RMB
Taiwan|Taipei|Asia|Chinese/Mandarin/Mandarin Chinese|dollar/New Taiwan dollar/Taiwan dollar/Taiwanese dollar
South Korea|Seoul|Asia|Korean|won/South Korean won/Korean won
North Korea|Pyongyang|Asia|Korean|won/North Korean won
Mongolia|Ulaanbaatar/Ulan Bator|Asia|Mongolian|tugrik/togrog/tögrög
India|New Delhi/Delhi|Asia|Hindi/English|rupee/Indian rupee
Pakistan|Islamabad|Asia|Urdu/English|rupee/Pakistani rupee
Bangladesh|Dhaka|Asia|Bengali/Bangla|taka/Bangladeshi taka
Nepal|Kathmandu|Asia|Nepali/Nepalese|rupee/Nepalese rupee
Sri Lanka|Sri Jayawardenepura Kotte/Kotte/Colombo|Asia|Sinhala/Sinhalese/Tamil|rupee/Sri Lankan rupee
Afghanistan|Kabul|Asia|Pashto/Dari/Persian|afghani
Iran|Tehran/Teheran|Asia|Persian/Farsi|rial/Iranian rial
Iraq|Baghdad|Asia|Arabic/Kurdish|dinar/Iraqi dinar
Saudi Arabia|Riyadh|Asia|Arabic|riyal/Saudi riyal
Qatar|Doha|Asia|Arabic|riyal/Qatari riyal
Oman|Muscat|Asia|Arabic|rial/Omani rial
Syria|Damascus|Asia|Arabic|pound/Syrian pound
Lebanon|Beirut|Asia|Arabic|pound/Lebanese pound/lira
Jordan|Amman|Asia|Arabic|dinar/Jordanian dinar
Kazakhstan|Astana/Nur-Sultan|Asia|Kazakh/Russian|tenge
Uzbekistan|Tashkent|Asia|Uzbek|som/sum/Uzbek som
Thailand|Bangkok|Asia|Thai|baht/Thai baht
Vietnam|Hanoi/Ha Noi|Asia|Vietnamese|dong/Vietnamese dong
Cambodia|Phnom Penh|Asia|Khmer/Cambodian|riel
Laos|Vientiane|Asia|Lao/Laotian|kip
Myanmar|Naypyidaw/Nay Pyi Taw/Naypyitaw|Asia|Burmese|kyat
Malaysia|Kuala Lumpur|Asia|Malay/Malaysian|ringgit/Malaysian ringgit
Indonesia|Jakarta|Asia|Indonesian/Bahasa Indonesia|rupiah/Indonesian rupiah
the Philippines|Manila|Asia|Filipino/Tagalog/English|peso/Philippine peso
Australia|Canberra|Oceania/Australia|English|dollar/Australian dollar
New Zealand|Wellington|Oceania/Australia|English/Maori|dollar/New Zealand dollar
Canada|Ottawa|North America|English/French|dollar/Canadian dollar
the United States|Washington|North America|English|dollar/US dollar/U.S. dollar/United States dollar/American dollar
Mexico|Mexico City|North America|Spanish|peso/Mexican peso
Cuba|Havana|North America|Spanish|peso/Cuban peso
Jamaica|Kingston|North America|English|dollar/Jamaican dollar
Nicaragua|Managua|North America|Spanish|cordoba/Nicaraguan cordoba
Brazil|Brasilia|South America|Portuguese/Brazilian Portuguese|real/Brazilian real
Argentina|Buenos Aires|South America|Spanish|peso/Argentine peso
Chile|Santiago|South America|Spanish|peso/Chilean peso
Peru|Lima|South America|Spanish/Quechua|sol/Peruvian sol/nuevo sol
Colombia|Bogota|South America|Spanish|peso/Colombian peso
Venezuela|Caracas|South America|Spanish|bolivar/Venezuelan bolivar
Ecuador|Quito|South America|Spanish|dollar/US dollar/U.S. dollar/United States dollar
Bolivia|Sucre/La Paz|South America|Spanish|boliviano
Paraguay|Asuncion|South America|Spanish/Guarani|guarani
Uruguay|Montevideo|South America|Spanish|peso/Uruguayan peso"""

# element | symbol (iron is a few-shot example)
ELEMENTS = """\
hydrogen H|helium He|lithium Li|beryllium Be|boron B|carbon C|nitrogen N|oxygen O|fluorine F|neon Ne|sodium Na
magnesium Mg|aluminium Al|silicon Si|phosphorus P|sulfur S|chlorine Cl|argon Ar|potassium K|calcium Ca
scandium Sc|titanium Ti|vanadium V|chromium Cr|manganese Mn|cobalt Co|nickel Ni|copper Cu|zinc Zn|gallium Ga
germanium Ge|arsenic As|selenium Se|bromine Br|krypton Kr|rubidium Rb|strontium Sr|silver Ag|cadmium Cd|tin Sn
antimony Sb|iodine I|xenon Xe|caesium Cs|barium Ba|tungsten W|osmium Os|iridium Ir|platinum Pt|gold Au
mercury Hg|lead Pb|bismuth Bi|radon Rn|radium Ra|uranium U|plutonium Pu|palladium Pd"""

# title | author aliases ("Hamlet" is a few-shot example)
BOOKS = """\
Pride and Prejudice|Jane Austen/Austen
Emma|Jane Austen/Austen
Sense and Sensibility|Jane Austen/Austen
1984|George Orwell/Orwell
Animal Farm|George Orwell/Orwell
War and Peace|Leo Tolstoy/Lev Tolstoy/Tolstoy
Anna Karenina|Leo Tolstoy/Lev Tolstoy/Tolstoy
Don Quixote|Miguel de Cervantes/Cervantes
Moby-Dick|Herman Melville/Melville
The Great Gatsby|F. Scott Fitzgerald/F Scott Fitzgerald/Scott Fitzgerald/Fitzgerald
Crime and Punishment|Fyodor Dostoevsky/Fyodor Dostoyevsky/Dostoevsky/Dostoyevsky
The Brothers Karamazov|Fyodor Dostoevsky/Fyodor Dostoyevsky/Dostoevsky/Dostoyevsky
Romeo and Juliet|William Shakespeare/Shakespeare
Macbeth|William Shakespeare/Shakespeare
Othello|William Shakespeare/Shakespeare
King Lear|William Shakespeare/Shakespeare
The Odyssey|Homer
The Iliad|Homer
Frankenstein|Mary Shelley/Mary Wollstonecraft Shelley/Shelley
Oliver Twist|Charles Dickens/Dickens
Great Expectations|Charles Dickens/Dickens
A Tale of Two Cities|Charles Dickens/Dickens
Ulysses|James Joyce/Joyce
On the Origin of Species|Charles Darwin/Darwin
Les Miserables|Victor Hugo/Hugo
The Divine Comedy|Dante Alighieri/Dante
Faust|Johann Wolfgang von Goethe/Goethe
To Kill a Mockingbird|Harper Lee
The Adventures of Tom Sawyer|Mark Twain/Twain/Samuel Clemens
The Adventures of Huckleberry Finn|Mark Twain/Twain/Samuel Clemens
Brave New World|Aldous Huxley/Huxley
The Hobbit|J. R. R. Tolkien/J.R.R. Tolkien/JRR Tolkien/Tolkien
The Lord of the Rings|J. R. R. Tolkien/J.R.R. Tolkien/JRR Tolkien/Tolkien
Harry Potter and the Philosopher's Stone|J. K. Rowling/J.K. Rowling/JK Rowling/Rowling
One Hundred Years of Solitude|Gabriel Garcia Marquez/Garcia Marquez
The Old Man and the Sea|Ernest Hemingway/Hemingway
The Sun Also Rises|Ernest Hemingway/Hemingway
Jane Eyre|Charlotte Bronte
Wuthering Heights|Emily Bronte
Dracula|Bram Stoker/Stoker
The Communist Manifesto|Karl Marx/Marx/Friedrich Engels/Engels
Alice's Adventures in Wonderland|Lewis Carroll/Carroll
The Catcher in the Rye|J. D. Salinger/J.D. Salinger/JD Salinger/Salinger
Madame Bovary|Gustave Flaubert/Flaubert
The Little Prince|Antoine de Saint-Exupery/Saint-Exupery
Of Mice and Men|John Steinbeck/Steinbeck
The Grapes of Wrath|John Steinbeck/Steinbeck
Fahrenheit 451|Ray Bradbury/Bradbury
The Metamorphosis|Franz Kafka/Kafka
The Trial|Franz Kafka/Kafka
Treasure Island|Robert Louis Stevenson/Stevenson
Robinson Crusoe|Daniel Defoe/Defoe
Gulliver's Travels|Jonathan Swift/Swift
The Picture of Dorian Gray|Oscar Wilde/Wilde
Twenty Thousand Leagues Under the Seas|Jules Verne/Verne
Around the World in Eighty Days|Jules Verne/Verne
The Three Musketeers|Alexandre Dumas/Dumas
The Count of Monte Cristo|Alexandre Dumas/Dumas
The Time Machine|H. G. Wells/H.G. Wells/HG Wells/Wells
The War of the Worlds|H. G. Wells/H.G. Wells/HG Wells/Wells
The Jungle Book|Rudyard Kipling/Kipling
Little Women|Louisa May Alcott/Alcott
The Canterbury Tales|Geoffrey Chaucer/Chaucer
Paradise Lost|John Milton/Milton
The Prince|Niccolo Machiavelli/Machiavelli
A Brief History of Time|Stephen Hawking/Hawking
The Da Vinci Code|Dan Brown
The Shining|Stephen King
Murder on the Orient Express|Agatha Christie/Christie
Charlie and the Chocolate Factory|Roald Dahl/Dahl
The Cat in the Hat|Dr. Seuss/Dr Seuss/Seuss/Theodor Geisel
Peter Pan|J. M. Barrie/J.M. Barrie/JM Barrie/Barrie
Gone with the Wind|Margaret Mitchell
Things Fall Apart|Chinua Achebe/Achebe
Mrs Dalloway|Virginia Woolf/Woolf
Catch-22|Joseph Heller/Heller
Slaughterhouse-Five|Kurt Vonnegut/Vonnegut
Dune|Frank Herbert/Herbert"""

# question (after "In what year ") | year (1945 is a few-shot answer, but its question is not repeated)
YEARS = """\
did World War I begin?|1914
did World War I end?|1918
did World War II begin?|1939
did humans first land on the Moon?|1969
did the Berlin Wall fall?|1989
was the Berlin Wall built?|1961
did the French Revolution begin?|1789
did Columbus first reach the Americas?|1492
did the Titanic sink?|1912
was the United States Declaration of Independence signed?|1776
did the Soviet Union dissolve?|1991
was the Battle of Hastings fought?|1066
did Martin Luther publish his Ninety-five Theses?|1517
was the Battle of Waterloo fought?|1815
did the Wall Street Crash happen?|1929
was Pearl Harbor attacked?|1941
was the Magna Carta sealed?|1215
was Sputnik launched?|1957
did the September 11 attacks happen?|2001
did the Chernobyl disaster happen?|1986
was Nelson Mandela released from prison?|1990
did Queen Victoria die?|1901
was Abraham Lincoln assassinated?|1865
did the Great Fire of London happen?|1666
did the Russian Revolution happen?|1917
did India gain independence?|1947
did Constantinople fall to the Ottomans?|1453
was William Shakespeare born?|1564
was Wolfgang Amadeus Mozart born?|1756
did the Wright brothers make the first powered flight?|1903
was the first iPhone released?|2007
did the American Civil War begin?|1861
were the first modern Olympic Games held?|1896
did Napoleon Bonaparte die?|1821
was the Battle of Gettysburg fought?|1863
was the Spanish Armada defeated?|1588
was Mahatma Gandhi assassinated?|1948
was John F. Kennedy assassinated?|1963
was the Eiffel Tower completed?|1889
was Albert Einstein born?|1879
was Napoleon crowned Emperor of the French?|1804
was the Battle of Trafalgar fought?|1805
did the Korean War begin?|1950
did the Vietnam War end?|1975
did Nelson Mandela become President of South Africa?|1994
was the Hubble Space Telescope launched?|1990
did Yuri Gagarin fly into space?|1961
did the Cuban Missile Crisis take place?|1962
did the Boston Tea Party take place?|1773
did Mount Vesuvius destroy Pompeii?|79/AD 79/79 AD
did Elizabeth II become queen?|1952
was Hong Kong handed back to China?|1997
did Charles Darwin publish On the Origin of Species?|1859"""

# animal | name of its young (aliases)
YOUNG = """\
cat|kitten/kitty|dog|puppy/pup|cow|calf|horse|foal/colt/filly|sheep|lamb|goat|kid|pig|piglet/shoat
duck|duckling|goose|gosling|swan|cygnet|frog|tadpole/froglet/polliwog|kangaroo|joey|bear|cub|lion|cub
tiger|cub|fox|kit/cub/pup|wolf|pup/cub|deer|fawn|owl|owlet|eagle|eaglet|chicken|chick|butterfly|caterpillar/larva
seal|pup|whale|calf|elephant|calf|rabbit|kit/kitten/bunny|hare|leveret|giraffe|calf|zebra|foal|donkey|foal
fish|fry/fingerling|koala|joey|hippopotamus|calf|penguin|chick"""

# word | opposites
OPPOSITES = """\
hot|cold|big|small/little/tiny|tall|short|fast|slow|happy|sad/unhappy|up|down|open|closed/shut|good|bad/evil
rich|poor|wet|dry|full|empty|early|late|day|night|black|white|yes|no|true|false|win|lose|love|hate
begin|end/finish|push|pull|strong|weak|loud|quiet/soft/silent|high|low|thick|thin|clean|dirty|inside|outside
above|below/beneath/under|north|south|east|west|buy|sell|friend|enemy/foe|alive|dead|first|last|cheap|expensive
remember|forget|arrive|leave/depart|ancient|modern|war|peace|give|take/receive|increase|decrease/reduce
wide|narrow|heavy|light|deep|shallow|asleep|awake|visible|invisible|success|failure|question|answer|summer|winter
young|old|hard|soft/easy|light|dark/heavy|sweet|sour/bitter|top|bottom|never|always|before|after"""

# question | answer aliases
GENERAL = """\
What is the largest planet in the Solar System?|Jupiter
Which planet is closest to the Sun?|Mercury
Which planet is known as the Red Planet?|Mars
Which planet is famous for its rings?|Saturn
What is the hottest planet in the Solar System?|Venus
How many planets are in the Solar System?|8/eight
What is the longest river in Africa?|Nile/Nile River
What is the longest river in South America?|Amazon/Amazon River
What is the tallest mountain in the world?|Mount Everest/Mt. Everest/Mt Everest/Everest
What is the largest ocean on Earth?|Pacific/Pacific Ocean
What is the largest continent?|Asia
How many continents are there?|7/seven
What is the largest country by area?|Russia/Russian Federation
At what temperature in degrees Celsius does water boil at sea level?|100
At what temperature in degrees Celsius does water freeze?|0/zero
How many days are in a leap year?|366
How many sides does a hexagon have?|6/six
How many legs does a spider have?|8/eight
How many legs does an insect have?|6/six
How many minutes are in an hour?|60/sixty
How many hours are in a day?|24
How many bones are in the adult human body?|206
What is the square root of 81?|9/nine
What is the smallest prime number?|2/two
What is the chemical formula of water?|H2O
What is the chemical formula of table salt?|NaCl
What gas do plants absorb from the air?|carbon dioxide/CO2
What is the largest mammal?|blue whale
What is the fastest land animal?|cheetah
What is the largest organ of the human body?|skin
What is the hardest natural substance?|diamond/diamonds
Who painted the Mona Lisa?|Leonardo da Vinci/Leonardo/da Vinci
Who painted "The Starry Night"?|Vincent van Gogh/van Gogh
Who painted the ceiling of the Sistine Chapel?|Michelangelo
Who composed the "Moonlight Sonata"?|Ludwig van Beethoven/Beethoven
Who composed "The Magic Flute"?|Wolfgang Amadeus Mozart/Mozart
Who developed the theory of relativity?|Albert Einstein/Einstein
Who discovered penicillin?|Alexander Fleming/Fleming
Who invented the telephone?|Alexander Graham Bell/Graham Bell/Bell
Who was the first person to walk on the Moon?|Neil Armstrong/Armstrong
Who was the first president of the United States?|George Washington/Washington
Who formulated the laws of motion and universal gravitation?|Isaac Newton/Newton"""

# Kinds added for leave-one-kind-out evaluation (issue 37). Same rules: aliases separated by "/",
# every alias accepted by the correctness rule; invented subjects where no answer can exist.
US = "the United States/United States/US/U.S./USA/U.S.A./America/United States of America"
UK = "the United Kingdom/United Kingdom/UK/U.K./Britain/Great Britain"
NL = "the Netherlands/Netherlands/Holland"
KOREA = "South Korea/Korea/Republic of Korea"

# city (not a capital) | country aliases
CITIES = f"""\
Barcelona|Spain
Seville|Spain
Valencia|Spain
Munich|Germany
Hamburg|Germany
Frankfurt|Germany
Milan|Italy
Naples|Italy
Florence|Italy
Venice|Italy
Marseille|France
Lyon|France
Porto|Portugal
Manchester|England/{UK}
Liverpool|England/{UK}
Edinburgh|Scotland/{UK}
Rotterdam|{NL}
Antwerp|Belgium
Geneva|Switzerland
Zurich|Switzerland
Krakow|Poland
Saint Petersburg|Russia
Istanbul|Turkey/Turkiye
Osaka|Japan
Kyoto|Japan
Shanghai|China
Mumbai|India
Bangalore|India
Karachi|Pakistan
Sydney|Australia
Melbourne|Australia
Auckland|New Zealand
Toronto|Canada
Vancouver|Canada
Chicago|{US}
Los Angeles|{US}
Houston|{US}
Rio de Janeiro|Brazil
Sao Paulo|Brazil
Casablanca|Morocco
Alexandria|Egypt
Lagos|Nigeria
Johannesburg|South Africa
Guadalajara|Mexico
Medellin|Colombia
Dubai|the United Arab Emirates/United Arab Emirates/UAE/U.A.E.
Busan|{KOREA}
Ho Chi Minh City|Vietnam"""

# landmark (with its article) | city aliases
LANDMARKS = """\
the Eiffel Tower|Paris
the Louvre|Paris
the Arc de Triomphe|Paris
the Colosseum|Rome
the Trevi Fountain|Rome
Big Ben|London
Buckingham Palace|London
Tower Bridge|London
the Statue of Liberty|New York/New York City/NYC
the Empire State Building|New York/New York City/NYC
Times Square|New York/New York City/NYC
the Brandenburg Gate|Berlin
the Acropolis|Athens
the Kremlin|Moscow
Red Square|Moscow
the Sagrada Familia|Barcelona
the Golden Gate Bridge|San Francisco
the Taj Mahal|Agra
the Forbidden City|Beijing/Peking
the Space Needle|Seattle
the Gateway Arch|St. Louis/St Louis/Saint Louis
the CN Tower|Toronto
Christ the Redeemer|Rio de Janeiro/Rio
the Burj Khalifa|Dubai
the Petronas Towers|Kuala Lumpur
the Alhambra|Granada
the Hagia Sophia|Istanbul/Constantinople
the Atomium|Brussels
the Rijksmuseum|Amsterdam
the Prado Museum|Madrid
the Uffizi Gallery|Florence
the Hermitage Museum|Saint Petersburg/St. Petersburg/St Petersburg
Charles Bridge|Prague
Schonbrunn Palace|Vienna
the White House|Washington/Washington, D.C./Washington D.C./Washington DC
the Lincoln Memorial|Washington/Washington, D.C./Washington D.C./Washington DC
the Little Mermaid statue|Copenhagen
the Hollywood sign|Los Angeles/Hollywood/LA"""

# singular | plural aliases (no invented words: a made-up noun has a plural by rule)
PLURALS = """\
mouse|mice|child|children|man|men|woman|women|tooth|teeth|foot|feet|goose|geese|person|people/persons
ox|oxen|cactus|cacti/cactuses|fungus|fungi/funguses|nucleus|nuclei|radius|radii|crisis|crises|thesis|theses
analysis|analyses|phenomenon|phenomena|criterion|criteria|leaf|leaves|knife|knives|wife|wives|wolf|wolves
life|lives|half|halves|shelf|shelves|potato|potatoes|tomato|tomatoes|hero|heroes|box|boxes|church|churches
baby|babies|city|cities|sheep|sheep|deer|deer|fish|fish/fishes|moose|moose|cat|cats|house|houses|bus|buses/busses
dish|dishes|key|keys|louse|lice|die|dice|index|indices/indexes|matrix|matrices"""

# verb | past tense aliases (no invented verbs, as for plurals)
PAST = """\
go|went|eat|ate|see|saw|take|took|give|gave|write|wrote|run|ran|swim|swam|sing|sang|drink|drank|begin|began
think|thought|bring|brought|buy|bought|catch|caught|teach|taught|fight|fought|seek|sought|fly|flew|grow|grew
know|knew|throw|threw|draw|drew|speak|spoke|break|broke|choose|chose|freeze|froze|drive|drove|ride|rode
rise|rose|sit|sat|stand|stood|sleep|slept|keep|kept|feel|felt|meet|met|hold|held|tell|told|sell|sold|find|found
make|made|say|said|pay|paid|walk|walked|jump|jumped|play|played|cry|cried|stop|stopped"""

FOOTBALL = "football/soccer/association football"
F1 = "Formula One/Formula 1/F1/motor racing/auto racing/racing/motorsport"
TRACK = "athletics/sprinting/sprint/running/track and field/track"
# athlete | sport aliases
ATHLETES = f"""\
Michael Jordan|basketball
LeBron James|basketball
Kobe Bryant|basketball
Wilt Chamberlain|basketball
Roger Federer|tennis
Serena Williams|tennis
Rafael Nadal|tennis
Novak Djokovic|tennis
Bjorn Borg|tennis
Martina Navratilova|tennis
Lionel Messi|{FOOTBALL}
Cristiano Ronaldo|{FOOTBALL}
Pele|{FOOTBALL}
Diego Maradona|{FOOTBALL}
Zinedine Zidane|{FOOTBALL}
David Beckham|{FOOTBALL}
Tiger Woods|golf
Jack Nicklaus|golf
Usain Bolt|{TRACK}
Jesse Owens|{TRACK}/long jump
Michael Phelps|swimming
Mark Spitz|swimming
Muhammad Ali|boxing
Mike Tyson|boxing
Wayne Gretzky|ice hockey/hockey
Babe Ruth|baseball
Sachin Tendulkar|cricket
Don Bradman|cricket
Lewis Hamilton|{F1}
Michael Schumacher|{F1}
Ayrton Senna|{F1}
Tom Brady|American football/football
Simone Biles|gymnastics
Nadia Comaneci|gymnastics
Eddy Merckx|cycling/road cycling
Magnus Carlsen|chess
Garry Kasparov|chess
Tony Hawk|skateboarding"""

# English word | French word: "le x" / "la x" / "l'x" adds the bare noun and its indefinite form as aliases
FRENCH = """\
cat|le chat|dog|le chien|house|la maison|water|l'eau|bread|le pain|apple|la pomme|book|le livre
cheese|le fromage|sun|le soleil|moon|la lune|school|l'ecole|car|la voiture|sea|la mer|tree|l'arbre
flower|la fleur|milk|le lait|wine|le vin|window|la fenetre|door|la porte|night|la nuit|city|la ville
king|le roi|horse|le cheval|bird|l'oiseau|fish|le poisson|love|l'amour|red|rouge|green|vert/verte
white|blanc/blanche|black|noir/noire|small|petit/petite|thank you|merci|hello|bonjour/salut
goodbye|au revoir/adieu|yes|oui|no|non|three|trois|ten|dix|friend|ami/amie/l'ami/l'amie/un ami/une amie"""

# animal | sound aliases (each sound also as "-s" and "-ing" forms: "the cow moos")
SOUNDS = """\
cow|moo|dog|bark/woof|cat|meow/miaow/mew/purr|duck|quack|sheep|baa/bleat|pig|oink/grunt|horse|neigh/whinny
lion|roar|owl|hoot|snake|hiss|bee|buzz/hum|frog|croak/ribbit|rooster|cock-a-doodle-doo/crow|donkey|bray/hee-haw
wolf|howl|mouse|squeak|goose|honk|crow|caw|elephant|trumpet|turkey|gobble|goat|bleat/baa|chicken|cluck
dove|coo|pigeon|coo|cricket|chirp|hyena|laugh/cackle/whoop|bear|growl/roar"""

JAPAN, CHINA, INDIA, GERMANY = "Japan", "China", "India", "Germany"
# company | country of its headquarters (aliases)
COMPANIES = f"""\
Toyota|{JAPAN}
Sony|{JAPAN}
Nintendo|{JAPAN}
Honda|{JAPAN}
Canon|{JAPAN}
Samsung|{KOREA}
Hyundai|{KOREA}
Volkswagen|{GERMANY}
BMW|{GERMANY}
Siemens|{GERMANY}
Adidas|{GERMANY}
Nokia|Finland
Spotify|Sweden
Ericsson|Sweden
Lego|Denmark
Carlsberg|Denmark
Nestle|Switzerland
Rolex|Switzerland
Novartis|Switzerland
Ferrari|Italy
Gucci|Italy
Michelin|France
Renault|France
Peugeot|France
Danone|France
Philips|{NL}
Heineken|{NL}
Infosys|{INDIA}
Huawei|{CHINA}
Alibaba|{CHINA}
Tencent|{CHINA}
Microsoft|{US}
Boeing|{US}
Coca-Cola|{US}
McDonald's|{US}
Walmart|{US}
Embraer|Brazil
Petrobras|Brazil
Gazprom|Russia
Qantas|Australia
BlackBerry|Canada"""

# person | nationality aliases
NATIONALITIES = f"""\
Pablo Picasso|Spanish
Salvador Dali|Spanish/Catalan
Vincent van Gogh|Dutch
Rembrandt|Dutch
Frida Kahlo|Mexican
Leonardo da Vinci|Italian
Galileo Galilei|Italian
Giuseppe Verdi|Italian
Antonio Vivaldi|Italian
Wolfgang Amadeus Mozart|Austrian
Sigmund Freud|Austrian
Gustav Klimt|Austrian
Ludwig van Beethoven|German
Johann Sebastian Bach|German
Karl Marx|German
Napoleon Bonaparte|French/Corsican
Claude Monet|French
Charles de Gaulle|French
Winston Churchill|British/English
Isaac Newton|English/British
Charles Darwin|English/British
Nelson Mandela|South African
Mahatma Gandhi|Indian
Confucius|Chinese
Leo Tolstoy|Russian
Pyotr Ilyich Tchaikovsky|Russian
Hans Christian Andersen|Danish
Henrik Ibsen|Norwegian
Edvard Munch|Norwegian
Jean Sibelius|Finnish
Alfred Nobel|Swedish
Simon Bolivar|Venezuelan
Akira Kurosawa|Japanese
Bob Marley|Jamaican
Abraham Lincoln|American/US/U.S.
Socrates|Greek/Athenian"""

# thing (with its article) | colour aliases
COLOURS = """\
a ripe banana|yellow
grass|green
snow|white
coal|black
a ripe tomato|red
a flamingo|pink
a lemon|yellow
milk|white
blood|red
a polar bear|white
chocolate|brown
an emerald|green
a ruby|red
a sapphire|blue
a carrot|orange
a pumpkin|orange
a lime|green
an eggplant|purple/violet/dark purple
a strawberry|red
a canary|yellow
a raven|black
a fire engine|red
a plum|purple/violet/dark purple
a cherry|red
a clear daytime sky|blue/light blue/sky blue
a blueberry|blue/dark blue/purple/blue-purple"""

INVENTED_CITIES = ("Valdremont", "Korvassa", "Ostmere Falls", "Drellingham")
INVENTED_LANDMARKS = ("the Tower of Quessaly", "the Velmora Bridge", "the Pellish Gate", "the Orvane Basilica")
INVENTED_ATHLETES = ("Kastor Velimund", "Orla Brennick", "Tavi Maronen", "Dusan Kelvoric")
INVENTED_COMPANIES = ("Quorvane Industries", "Drumhollow Motors", "Pellmarsh Foods", "Ysselmoor Electric")
INVENTED_PEOPLE = ("Ilvar Penthesk", "Maritsa Olvendahl", "Teodor Vranske", "Casimir Dolbrecht")

# Invented entities: names that belong to nothing real.
INVENTED_COUNTRIES = ("Veltravia", "Zarkovia", "Ostrelund", "Quenmaria", "Drovnia", "Kelvathia", "Thessivar",
                      "Brolkania", "Ulvessa", "Norvaskia", "Pelandria", "Marendor", "Glavenia", "Istrowa")
INVENTED_BOOKS = ("The Glass Orchard of Vintreth", "Seven Lanterns for Old Kasimir", "The Salt Archives of Drumhollow",
                  "A Grammar of Quiet Engines", "The Widow of Pellmarsh Lock", "Under the Ninth Copper Moon",
                  "The Cartographer of Ysselmoor", "Letters from the Orvane Coast", "The Brass Choir of Tallowmere",
                  "Nine Winters in Quessary", "The Lamplighter of Brevasse", "A Season of Hollow Bells")
INVENTED_ELEMENTS = ("quorbium", "zanthorium", "draxium", "pellonium", "virentium", "ostrogium", "kelvadium",
                     "morrenium", "thalvium", "brisconium")
INVENTED_EVENTS = ("did the Treaty of Melvarde end the Osterian War?", "was the Kelvathian Republic founded?",
                   "did the Great Zarkovian Flood happen?", "did Queen Amalthe of Drovnia die?",
                   "was the Vintreth Accord signed?", "did the Battle of Corrowmere take place?",
                   "was the Pellandrian Academy of Sciences founded?", "did the Ulvessan Civil War begin?",
                   "did the Siege of Harrowdane end?", "was the Norvaskian constitution adopted?")
INVENTED_ANIMALS = ("glimmerwick", "snorvel", "tralbeast", "quillock", "marrowhound", "fennibat")
INVENTED_WORDS = ("florb", "grendish", "plimsy", "vorack", "stumbrel", "quanter")
INVENTED_GENERAL = ("Who was the first president of Ostrelund?", "What is the largest moon of the planet Threxis?",
                    'Who painted "The Blue Widow of Castrane"?', "Who discovered the Pellish radiation?",
                    'Who composed the "Sonata of Drumhollow"?', "What is the longest river in Quenmaria?")

NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
                "sixteen seventeen eighteen nineteen twenty").split()


def _aliases(field: str) -> list[str]:
    return [a.strip() for a in field.split("/") if a.strip()]


def _row(prompt: str, answers: list[str], kind: str, subject: str) -> dict:
    return {"prompt": prompt, "answers": answers, "kind": kind, "subject": subject}


def _pairs(table: str) -> list[tuple[str, str]]:
    """``a|b|c|d`` over several lines → [(a, b), (c, d)]."""
    cells = [c.strip() for c in table.replace("\n", "|").split("|")]
    if len(cells) % 2:
        raise ValueError("a pair table has an odd number of cells")
    return list(zip(cells[::2], cells[1::2]))


def _number_answers(n: int) -> list[str]:
    return [str(n)] + ([NUMBER_WORDS[n]] if 0 <= n < len(NUMBER_WORDS) else [])


def country_questions() -> list[dict]:
    rows = []
    forms = {
        "capital": "What is the capital of {}?",
        "continent": "On which continent is {}?",
        "language": "What language is spoken in {}?",
        "currency": "What is the currency of {}?",
    }
    table = [line.split("|") for line in COUNTRIES.splitlines()]
    for kind, form in forms.items():
        column = list(forms).index(kind) + 1
        for cells in table:
            name, answer = cells[0], cells[column]
            if answer == "-":
                continue
            subject = name.removeprefix("the ")
            rows.append(_row(form.format(name), _aliases(answer), kind, subject))
    return rows


def symbol_questions() -> list[dict]:
    pairs = [tuple(item.split()) for line in ELEMENTS.splitlines() for item in line.split("|")]
    return [_row(f"What is the chemical symbol for {element}?", [symbol], "chemical_symbol", element)
            for element, symbol in pairs]


def author_questions() -> list[dict]:
    rows = []
    for line in BOOKS.splitlines():
        title, authors = line.split("|")
        rows.append(_row(f'Who wrote "{title}"?', _aliases(authors), "author", title))
    return rows


def year_questions() -> list[dict]:
    rows = []
    for line in YEARS.splitlines():
        question, year = line.split("|")
        rows.append(_row(f"In what year {question}", _aliases(year), "year", question.rstrip("?")))
    return rows


def arithmetic_questions(seed: int = 0) -> list[dict]:
    """40 sums, 20 differences, 25 products of small numbers, drawn without repeats by a seeded generator."""
    rng = random.Random(seed)
    ops = [("plus", lambda a, b: a + b, 40, (1, 20)), ("minus", lambda a, b: a - b, 20, (2, 30)),
           ("times", lambda a, b: a * b, 25, (2, 12))]
    rows, seen = [], set()
    for word, fn, count, (lo, hi) in ops:
        made = 0
        while made < count:
            a, b = rng.randint(lo, hi), rng.randint(lo, hi)
            if word == "minus" and a <= b:
                continue
            if (word, a, b) in seen:
                continue
            seen.add((word, a, b))
            prompt = f"What is {a} {word} {b}?"
            rows.append(_row(prompt, _number_answers(fn(a, b)), "arithmetic", prompt))
            made += 1
    return rows


def opposite_questions() -> list[dict]:
    return [_row(f'What is the opposite of "{word}"?', _aliases(opposite), "opposite", word)
            for word, opposite in _pairs(OPPOSITES)]


def young_questions() -> list[dict]:
    return [_row(f"What is a baby {animal} called?", _aliases(young), "animal_young", animal)
            for animal, young in _pairs(YOUNG)]


def general_questions() -> list[dict]:
    rows = []
    for line in GENERAL.splitlines():
        question, answers = line.split("|")
        rows.append(_row(question, _aliases(answers), "general", question))
    return rows


def _lines(table: str) -> list[tuple[str, str]]:
    """``subject|aliases`` one per line → [(subject, aliases)]."""
    return [tuple(line.split("|", 1)) for line in table.splitlines()]


def _article(word: str) -> str:
    return ("an " if word[0].lower() in "aeiou" else "a ") + word


def _strip_article(text: str) -> str:
    for article in ("the ", "a ", "an "):
        if text.startswith(article):
            return text[len(article):]
    return text


def city_questions() -> list[dict]:
    return [_row(f"In which country is {city}?", _aliases(countries), "city_country", city)
            for city, countries in _lines(CITIES)]


def landmark_questions() -> list[dict]:
    return [_row(f"In which city is {name}?", _aliases(cities), "landmark_city", _strip_article(name))
            for name, cities in _lines(LANDMARKS)]


def plural_questions() -> list[dict]:
    return [_row(f'What is the plural of "{word}"?', _aliases(plural), "plural", word) for word, plural in _pairs(PLURALS)]


def past_tense_questions() -> list[dict]:
    return [_row(f'What is the past tense of "{verb}"?', _aliases(past), "past_tense", verb) for verb, past in _pairs(PAST)]


def sport_questions() -> list[dict]:
    return [_row(f"Which sport is {name} famous for?", _aliases(sports), "sport", name) for name, sports in _lines(ATHLETES)]


def _french_aliases(field: str) -> list[str]:
    """``le chat`` → chat, le chat, un chat; ``la x`` → x, la x, une x; ``l'x`` → x, l'x; anything else as written."""
    out = []
    for alias in _aliases(field):
        for article, indefinite in (("le ", "un "), ("la ", "une "), ("l'", "")):
            if alias.startswith(article):
                noun = alias[len(article):]
                out += [noun, alias] + ([indefinite + noun] if indefinite else [])
                break
        else:
            out.append(alias)
    return list(dict.fromkeys(out))


def french_questions() -> list[dict]:
    return [_row(f'What is the French word for "{word}"?', _french_aliases(french), "french_word", word)
            for word, french in _pairs(FRENCH)]


def _sound_aliases(field: str) -> list[str]:
    """Each sound, and for one-word sounds its ``-s`` and ``-ing`` forms ("moo", "moos", "mooing")."""
    out = []
    for sound in _aliases(field):
        out.append(sound)
        if sound.isalpha():
            out += [sound + ("es" if sound.endswith(("s", "sh", "ch", "x", "z")) else "s"), sound + "ing"]
    return out


def sound_questions() -> list[dict]:
    return [_row(f"What sound does {_article(animal)} make?", _sound_aliases(sounds), "animal_sound", animal)
            for animal, sounds in _pairs(SOUNDS)]


def company_questions() -> list[dict]:
    return [_row(f"In which country is the company {name} based?", _aliases(countries), "company_country", name)
            for name, countries in _lines(COMPANIES)]


def nationality_questions() -> list[dict]:
    return [_row(f"What was the nationality of {name}?", _aliases(nations), "nationality", name)
            for name, nations in _lines(NATIONALITIES)]


def colour_questions() -> list[dict]:
    return [_row(f"What colour is {thing}?", _aliases(colours), "colour", _strip_article(thing))
            for thing, colours in _lines(COLOURS)]


def invented_questions() -> list[dict]:
    """The real kinds' question forms about made-up entities (no correct answer exists)."""
    rows = []
    forms = ("What is the capital of {}?", "On which continent is {}?", "What language is spoken in {}?",
             "What is the currency of {}?")
    for i, country in enumerate(INVENTED_COUNTRIES):
        for form in (forms[0], forms[1 + i % 3]):  # every made-up country: its capital and one more question
            rows.append(_row(form.format(country), [], "invented", country))
    rows += [_row(f'Who wrote "{title}"?', [], "invented", title) for title in INVENTED_BOOKS]
    rows += [_row(f"What is the chemical symbol for {e}?", [], "invented", e) for e in INVENTED_ELEMENTS]
    rows += [_row(f"In what year {event}", [], "invented", event.rstrip("?")) for event in INVENTED_EVENTS]
    rows += [_row(f"What is a baby {a} called?", [], "invented", a) for a in INVENTED_ANIMALS]
    rows += [_row(f'What is the opposite of "{w}"?', [], "invented", w) for w in INVENTED_WORDS]
    rows += [_row(q, [], "invented", q) for q in INVENTED_GENERAL]
    # the kinds added for leave-one-kind-out (no invented plurals or past tenses: a made-up word has them by rule)
    rows += [_row(f"In which country is {c}?", [], "invented", c) for c in INVENTED_CITIES]
    rows += [_row(f"In which city is {n}?", [], "invented", _strip_article(n)) for n in INVENTED_LANDMARKS]
    rows += [_row(f"Which sport is {n} famous for?", [], "invented", n) for n in INVENTED_ATHLETES]
    rows += [_row(f'What is the French word for "{w}"?', [], "invented", w) for w in INVENTED_WORDS[:4]]
    rows += [_row(f"What sound does {_article(a)} make?", [], "invented", a) for a in INVENTED_ANIMALS[:4]]
    rows += [_row(f"In which country is the company {n} based?", [], "invented", n) for n in INVENTED_COMPANIES]
    rows += [_row(f"What was the nationality of {n}?", [], "invented", n) for n in INVENTED_PEOPLE]
    rows += [_row(f"What colour is {_article(a)}?", [], "invented", a) for a in INVENTED_ANIMALS[4:]]
    return rows


def build_questions() -> list[dict]:
    rows = (country_questions() + symbol_questions() + author_questions() + year_questions()
            + arithmetic_questions() + opposite_questions() + young_questions() + general_questions()
            + city_questions() + landmark_questions() + plural_questions() + past_tense_questions()
            + sport_questions() + french_questions() + sound_questions() + company_questions()
            + nationality_questions() + colour_questions() + invented_questions())
    prompts = [r["prompt"] for r in rows]
    duplicates = sorted({p for p in prompts if prompts.count(p) > 1})
    if duplicates:
        raise ValueError(f"questions repeat: {duplicates[:5]}")
    in_preamble = [p for p in prompts if f"Q: {p}\n" in FEW_SHOT]
    if in_preamble:
        raise ValueError(f"questions repeat a few-shot example: {in_preamble}")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DATA_FILE))
    args = parser.parse_args(argv)
    rows = build_questions()
    Path(args.out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    kinds = sorted({r["kind"] for r in rows})
    print(f"wrote {len(rows)} questions to {args.out}: "
          + ", ".join(f"{k} {sum(r['kind'] == k for r in rows)}" for k in kinds))


if __name__ == "__main__":
    main()
