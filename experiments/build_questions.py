"""Build the labelled question set ``experiments/data/factual_prompts.jsonl`` from the facts below.

    python -m experiments.build_questions [--out PATH]

Deterministic: the facts are written here, arithmetic items come from a seeded generator,
and the order is fixed, so rerunning the command rewrites the same file. One JSON object
per line: ``{"prompt", "answers", "kind", "subject"}``. ``answers`` lists the aliases
accepted as correct (matching rule: :func:`experiments.factual_prompts.is_correct`);
``subject`` names the entity asked about, so questions about the same thing (a country's
capital, currency, language and continent) can be kept in one cross-validation fold.

Kinds: capital, continent, language, currency (one table of countries), chemical_symbol,
author, year, arithmetic, opposite, animal_young, general, and ``invented``: the same
question forms about entities that do not exist (made-up countries, books, elements,
events, animals, words), whose answer list is empty, so every completion is incorrect.
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
    return rows


def build_questions() -> list[dict]:
    rows = (country_questions() + symbol_questions() + author_questions() + year_questions()
            + arithmetic_questions() + opposite_questions() + young_questions() + general_questions()
            + invented_questions())
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
