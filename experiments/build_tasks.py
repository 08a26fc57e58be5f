"""Regenerate the shipped thought-patch tasks: ``python -m experiments.build_tasks``.

Each task is one JSON object on one line (``<name>.jsonl``): ``{"name", "kind",
"instruction", "train": [{"query", "answer"}], "test": [...], "fresh": [...]}``. The instruction is a
few-shot prompt (a header line and ``N_DEMOS`` solved examples, one per line); the
remaining examples are shuffled with the task's own seed and split into ``N_TRAIN``
calibration queries (train) and up to ``N_TEST`` held-out queries (test, at least
``MIN_TEST``). No query string is in two of the parts (fresh included). Every query is written
exactly as the demonstrations write it, without its answer (``"France:"``,
``"3 + 4 ="``); the answer follows after one space.

Kinds (Mazzawi, Dherin et al. 2025, arXiv 2510.08734, evaluate arithmetic, translation,
knowledge lookups and new key–value knowledge): arithmetic (``add``, ``plus_one``),
word transformations (``antonyms``, ``plural``, ``past_tense``), translations
(``en_fr``, ``en_es``, ``en_de``), factual lookups (``capitals``, ``languages``) and
formats (``uppercase``, ``number_words``). Shipped tasks must be answerable with the
instruction in context by at least one embedded model (``reports/eval_thought.md``
lists the full-instruction accuracy of each). The fixed texts of the locality measure
are in ``locality.json`` beside the tasks, written by hand (not generated here).

``fresh``: held out from every selection and tuning stage; scored once by the frozen
default (issue 22). Up to ``N_FRESH`` pairs per shipped task, built after the other
splits from their own lists and generators (``FRESH_*``, shuffled with ``seed +
FRESH_SEED``), so the instruction, train and test above are what they were before the
split existed. They are, in this order: the task's own pairs that the other splits leave
unused (same list, never in a file before; less the doubtful ``FRESH_DROP``), then new
pairs. No fresh query is a demonstration, train or test query; for the word
transformations no word of a fresh pair is in a pair of the other parts (no ``cold ->
hot`` beside ``hot -> cold``); for capitals no capital is either. Per task:

- ``add``: the 9 one-digit sums the other splits leave out, then sums of a number from
  10 to 19 and a one-digit number (either order; answers 11-28): the one-digit range
  holds 81 sums in all, so fresh ``add`` reaches past it.
- ``plus_one``: the 17 unused two-digit numbers, then ``n`` from 99 to 998.
- ``number_words``: the 27 unused numbers below 100, then 0, the hundreds (100-900) and
  the thousands 1000-99000 (``"21000" -> "twenty-one thousand"``): no number whose words
  take an optional "and" (``one hundred (and) five``).
- ``uppercase``: ``FRESH_WORDS``. Translations: ``FRESH_TRANSLATIONS`` (a word is left
  out for a language where it has two common translations). Antonyms, plurals, past
  tenses: ``FRESH_ANTONYMS``, ``FRESH_PLURALS``, ``FRESH_PAST`` (one clear answer each).
- ``capitals``: fewer than ``N_FRESH`` (``FEWER_FRESH``): the countries left after the
  shipped list, less those whose capital is disputed, split, moved lately, written two
  ways in English (diacritics, an apostrophe, "Kyiv"/"Kiev", "Washington, D.C."), named
  like the country, or whose own name is ambiguous ("Micronesia").
- ``languages``: fewer than ``N_FRESH`` (``FEWER_FRESH``): most countries left after the
  shipped list have two or more official or main languages and are left out.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from icl_lens.thought.tasks import TASK_DIR

GENERATED_BY = "python -m experiments.build_tasks"
N_DEMOS, N_TRAIN, N_TEST, MIN_TEST = 8, 32, 32, 24

CAPITALS = """France Paris|Japan Tokyo|Germany Berlin|Italy Rome|Spain Madrid|China Beijing|Russia Moscow|Egypt Cairo
Canada Ottawa|Australia Canberra|Argentina Buenos Aires|Peru Lima|Chile Santiago|Venezuela Caracas|Cuba Havana
Portugal Lisbon|Greece Athens|Turkey Ankara|Iran Tehran|Iraq Baghdad|Syria Damascus|Lebanon Beirut|Jordan Amman
Saudi Arabia Riyadh|India New Delhi|Pakistan Islamabad|Afghanistan Kabul|Bangladesh Dhaka|Nepal Kathmandu
Thailand Bangkok|Vietnam Hanoi|Indonesia Jakarta|Philippines Manila|Malaysia Kuala Lumpur|South Korea Seoul
North Korea Pyongyang|Kenya Nairobi|Ethiopia Addis Ababa|Ghana Accra|Senegal Dakar|Morocco Rabat|Algeria Algiers
Tunisia Tunis|Libya Tripoli|Sudan Khartoum|Uganda Kampala|Zimbabwe Harare|Zambia Lusaka|Angola Luanda|Norway Oslo
Sweden Stockholm|Finland Helsinki|Denmark Copenhagen|Iceland Reykjavik|Ireland Dublin|Austria Vienna|Poland Warsaw
Hungary Budapest|Romania Bucharest|Bulgaria Sofia|Serbia Belgrade|Croatia Zagreb|Belarus Minsk|Latvia Riga
Lithuania Vilnius|Estonia Tallinn|Georgia Tbilisi|Armenia Yerevan|Azerbaijan Baku|Qatar Doha|Oman Muscat
New Zealand Wellington|Jamaica Kingston|Ecuador Quito|Uruguay Montevideo|Nicaragua Managua|Cambodia Phnom Penh
Laos Vientiane|Taiwan Taipei|Netherlands Amsterdam|Belgium Brussels|Czech Republic Prague|Mongolia Ulaanbaatar"""

LANGUAGES = """France French|Germany German|Italy Italian|Spain Spanish|Portugal Portuguese|Russia Russian|China Chinese
Japan Japanese|Greece Greek|Turkey Turkish|Poland Polish|Sweden Swedish|Norway Norwegian|Denmark Danish|Finland Finnish
Netherlands Dutch|Hungary Hungarian|Iran Persian|Israel Hebrew|Egypt Arabic|Brazil Portuguese|Mexico Spanish
Argentina Spanish|South Korea Korean|Vietnam Vietnamese|Thailand Thai|Indonesia Indonesian|Czech Republic Czech
Romania Romanian|Ukraine Ukrainian|Bulgaria Bulgarian|Serbia Serbian|Croatia Croatian|Slovakia Slovak
Slovenia Slovenian|Latvia Latvian|Lithuania Lithuanian|Estonia Estonian|Iceland Icelandic|Georgia Georgian
Armenia Armenian|Albania Albanian|Mongolia Mongolian|Cambodia Khmer|Myanmar Burmese|Nepal Nepali|Bangladesh Bengali
Pakistan Urdu|Ethiopia Amharic|Kenya Swahili|Tanzania Swahili|Somalia Somali|Malaysia Malay|Austria German
Chile Spanish|Peru Spanish|Colombia Spanish|Cuba Spanish|Venezuela Spanish|Ecuador Spanish|Bolivia Spanish
Uruguay Spanish|Saudi Arabia Arabic|Iraq Arabic|Syria Arabic|Jordan Arabic|Morocco Arabic|Algeria Arabic
Libya Arabic|Tunisia Arabic|Lebanon Arabic|Kuwait Arabic|England English|Australia English|New Zealand English
Ireland English|Jamaica English|Angola Portuguese|Mozambique Portuguese|Laos Lao"""

FRENCH = """dog chien|cat chat|house maison|water eau|book livre|tree arbre|sun soleil|moon lune|bread pain|milk lait
apple pomme|car voiture|city ville|friend ami|red rouge|blue bleu|green vert|black noir|white blanc|small petit
day jour|night nuit|man homme|woman femme|child enfant|door porte|window fenêtre|chair chaise|bed lit|hand main
head tête|mouth bouche|horse cheval|bird oiseau|fish poisson|cow vache|flower fleur|sea mer|river rivière
mountain montagne|road route|king roi|queen reine|love amour|money argent|work travail|fire feu|snow neige
rain pluie|wind vent|sky ciel|star étoile|summer été|winter hiver|morning matin|evening soir|cheese fromage
wine vin|chicken poulet|sugar sucre|salt sel|butter beurre|garden jardin|kitchen cuisine|shirt chemise|hat chapeau
boat bateau|key clé|knife couteau|glass verre|forest forêt|church église|street rue|song chanson|world monde
brother frère|father père|mother mère"""

SPANISH = """dog perro|cat gato|house casa|water agua|book libro|tree árbol|sun sol|moon luna|bread pan|milk leche
apple manzana|city ciudad|friend amigo|school escuela|red rojo|blue azul|green verde|black negro|white blanco
day día|night noche|year año|man hombre|woman mujer|door puerta|window ventana|chair silla|bed cama|hand mano
head cabeza|eye ojo|heart corazón|mouth boca|horse caballo|bird pájaro|cow vaca|flower flor|sea mar|river río
mountain montaña|king rey|queen reina|love amor|time tiempo|money dinero|work trabajo|fire fuego|snow nieve
rain lluvia|wind viento|sky cielo|star estrella|summer verano|winter invierno|cheese queso|wine vino|egg huevo
chicken pollo|sugar azúcar|salt sal|garden jardín|kitchen cocina|shoe zapato|shirt camisa|hat sombrero|boat barco
key llave|knife cuchillo|spoon cuchara|forest bosque|island isla|church iglesia|street calle|song canción
world mundo|brother hermano|sister hermana|father padre|mother madre"""

GERMAN = """dog Hund|cat Katze|house Haus|water Wasser|book Buch|tree Baum|sun Sonne|moon Mond|bread Brot|milk Milch
apple Apfel|car Auto|city Stadt|friend Freund|school Schule|red rot|blue blau|green grün|black schwarz|white weiß
day Tag|night Nacht|year Jahr|man Mann|woman Frau|child Kind|door Tür|window Fenster|chair Stuhl|bed Bett
hand Hand|head Kopf|eye Auge|heart Herz|mouth Mund|horse Pferd|bird Vogel|fish Fisch|cow Kuh|flower Blume
sea Meer|river Fluss|mountain Berg|king König|queen Königin|love Liebe|time Zeit|money Geld|work Arbeit|fire Feuer
snow Schnee|rain Regen|wind Wind|sky Himmel|star Stern|summer Sommer|winter Winter|morning Morgen|evening Abend
cheese Käse|wine Wein|egg Ei|chicken Huhn|sugar Zucker|salt Salz|butter Butter|garden Garten|kitchen Küche
shoe Schuh|hat Hut|boat Boot|key Schlüssel|knife Messer|spoon Löffel|forest Wald|island Insel|church Kirche
street Straße|song Lied|world Welt|brother Bruder|sister Schwester|father Vater|mother Mutter"""

ANTONYMS = """hot cold|big small|up down|fast slow|happy sad|open closed|early late|rich poor|strong weak|young old
high low|hard soft|full empty|wet dry|long short|thick thin|clean dirty|loud quiet|good bad|true false|win lose
push pull|buy sell|give take|first last|inside outside|above below|before after|day night|begin end|love hate
friend enemy|alive dead|easy difficult|cheap expensive|safe dangerous|wide narrow|deep shallow|sweet sour|north south
east west|left right|question answer|arrive leave|remember forget|increase decrease|accept reject|agree disagree
always never|maximum minimum|success failure|victory defeat|entrance exit|import export|include exclude|major minor
positive negative|public private|visible invisible|possible impossible|legal illegal|polite rude|smooth rough
asleep awake|present absent|ancient modern|guilty innocent|freeze melt|whisper shout|float sink|rise fall"""

PLURALS = """cat cats|dog dogs|house houses|car cars|book books|tree trees|bird birds|apple apples|table tables|chair chairs
box boxes|bus buses|dish dishes|church churches|fox foxes|glass glasses|watch watches|brush brushes|kiss kisses
class classes|city cities|baby babies|lady ladies|party parties|story stories|country countries|family families
berry berries|puppy puppies|army armies|child children|man men|woman women|mouse mice|tooth teeth|foot feet
goose geese|person people|knife knives|wife wives|leaf leaves|wolf wolves|life lives|half halves|shelf shelves
thief thieves|potato potatoes|tomato tomatoes|hero heroes|cactus cacti|crisis crises|key keys|toy toys|day days
boy boys|pen pens|cup cups|hat hats|map maps|star stars|ship ships|river rivers|window windows|flower flowers
horse horses|garden gardens|teacher teachers|doctor doctors|farmer farmers|song songs|game games|bench benches"""

PAST = """walk walked|talk talked|play played|jump jumped|cook cooked|clean cleaned|open opened|watch watched
listen listened|call called|go went|see saw|eat ate|drink drank|run ran|swim swam|sing sang|write wrote|speak spoke
take took|give gave|come came|make made|know knew|think thought|buy bought|bring brought|teach taught|catch caught
fight fought|sleep slept|keep kept|feel felt|leave left|meet met|send sent|spend spent|build built|lose lost
find found|begin began|break broke|choose chose|drive drove|fall fell|fly flew|forget forgot|freeze froze|grow grew
hide hid|ride rode|shake shook|steal stole|throw threw|wake woke|wear wore|win won|tell told|sell sold|stop stopped
plan planned|study studied|cry cried|try tried|carry carried|dance danced|smile smiled|sit sat|stand stood
hold held|hear heard|pay paid|say said|lead led|feed fed|bite bit"""

WORDS = """apple river garden window yellow friend school mountain summer winter teacher doctor bread water orange castle
silver planet rabbit forest pencil candle bottle butter cotton dragon island jacket kitten ladder market needle ocean
parrot rocket saddle temple tunnel valley wallet anchor basket bridge cherry desert engine feather guitar hammer insect
jungle lemon mirror nature office pepper puzzle rubber shadow spider tiger violin wizard zebra camera circle dinner
flower honey letter monkey paper sugar tomato village"""

# --- the fresh split (issue 22): new pairs, never in a demonstration, train or test query ---------------------

N_FRESH, FRESH_SEED = 96, 1000
FEWER_FRESH = {  # tasks whose clean pairs do not reach N_FRESH, and why (the module docstring says more)
    "capitals": "the countries left after CAPITALS less disputed, split, moved, diacritic or same-name capitals",
    "languages": "the countries left after LANGUAGES less those with two or more official or main languages",
}
FRESH_DROP = {  # the task's own unused pairs kept out of fresh as doubtful: two official languages in common use
    "languages": ("Kenya", "Ethiopia"),
}

FRESH_CAPITALS = """Albania=Tirana|Andorra=Andorra la Vella|Bahamas=Nassau|Bahrain=Manama|Barbados=Bridgetown
Belize=Belmopan|Bhutan=Thimphu|Bosnia and Herzegovina=Sarajevo|Botswana=Gaborone|Brunei=Bandar Seri Begawan
Burkina Faso=Ouagadougou|Cape Verde=Praia|Central African Republic=Bangui|Comoros=Moroni|Cyprus=Nicosia
Democratic Republic of the Congo=Kinshasa|Republic of the Congo=Brazzaville|Dominica=Roseau
Dominican Republic=Santo Domingo|East Timor=Dili|El Salvador=San Salvador|Eritrea=Asmara|Fiji=Suva|Gabon=Libreville
Gambia=Banjul|Guatemala=Guatemala City|Guinea=Conakry|Guinea-Bissau=Bissau|Guyana=Georgetown|Haiti=Port-au-Prince
Honduras=Tegucigalpa|Kuwait=Kuwait City|Kyrgyzstan=Bishkek|Lesotho=Maseru|Liberia=Monrovia|Liechtenstein=Vaduz
Madagascar=Antananarivo|Malawi=Lilongwe|Mali=Bamako|Malta=Valletta|Marshall Islands=Majuro|Mauritania=Nouakchott
Mauritius=Port Louis|Mexico=Mexico City|Montenegro=Podgorica|Mozambique=Maputo|Namibia=Windhoek|Niger=Niamey
Nigeria=Abuja|North Macedonia=Skopje|Panama=Panama City|Papua New Guinea=Port Moresby|Rwanda=Kigali
Saint Kitts and Nevis=Basseterre|Saint Lucia=Castries|Saint Vincent and the Grenadines=Kingstown|Samoa=Apia
Seychelles=Victoria|Sierra Leone=Freetown|Slovakia=Bratislava|Slovenia=Ljubljana|Solomon Islands=Honiara
Somalia=Mogadishu|South Sudan=Juba|Suriname=Paramaribo|Switzerland=Bern|Tajikistan=Dushanbe|Turkmenistan=Ashgabat
Tuvalu=Funafuti|United Arab Emirates=Abu Dhabi|United Kingdom=London|Uzbekistan=Tashkent|Vanuatu=Port Vila"""

FRESH_LANGUAGES = """Honduras=Spanish|Guatemala=Spanish|El Salvador=Spanish|Nicaragua=Spanish|Costa Rica=Spanish
Panama=Spanish|Dominican Republic=Spanish|Oman=Arabic|Qatar=Arabic|Bahrain=Arabic|United Arab Emirates=Arabic
Yemen=Arabic|Sudan=Arabic|Mauritania=Arabic|United States=English|United Kingdom=English|Scotland=English
Bahamas=English|Barbados=English|Trinidad and Tobago=English|Guyana=English|Liberia=English|Grenada=English
Antigua and Barbuda=English|Saint Kitts and Nevis=English|Saint Vincent and the Grenadines=English|Monaco=French
Liechtenstein=German|San Marino=Italian|Andorra=Catalan|Suriname=Dutch|Uzbekistan=Uzbek|Turkmenistan=Turkmen
Tajikistan=Tajik|Bhutan=Dzongkha|Brunei=Malay|Madagascar=Malagasy|Samoa=Samoan|Tonga=Tongan
North Macedonia=Macedonian"""

# English, French, Spanish, German; "-": two common translations in that language (left out there)
FRESH_TRANSLATIONS = """table table mesa Tisch|bottle bouteille botella Flasche|cup tasse taza Tasse
plate assiette plato Teller|fork fourchette tenedor Gabel|spoon cuillère - -|bridge pont puente Brücke
ear oreille oreja Ohr|nose nez nariz Nase|tooth dent diente Zahn|arm bras brazo Arm|leg jambe pierna Bein
foot pied pie Fuß|finger doigt dedo Finger|knee genou rodilla Knie|shoulder épaule hombro Schulter
blood sang sangre Blut|bone os hueso Knochen|skin peau piel Haut|tongue langue lengua Zunge|lion lion león Löwe
bear ours oso Bär|wolf loup lobo Wolf|pig - cerdo Schwein|sheep mouton oveja Schaf|goat chèvre cabra Ziege
mouse souris ratón Maus|rabbit lapin conejo -|snake serpent serpiente Schlange|duck canard pato Ente
frog grenouille rana Frosch|bee abeille abeja Biene|ant fourmi hormiga Ameise
butterfly papillon mariposa Schmetterling|spider araignée araña Spinne|elephant éléphant elefante Elefant
monkey singe mono Affe|onion oignon cebolla Zwiebel|potato - - Kartoffel|carrot carotte zanahoria -
lemon citron limón Zitrone|grape raisin uva -|pear poire pera Birne|cherry cerise cereza Kirsche
strawberry fraise fresa Erdbeere|rice riz arroz Reis|meat viande carne Fleisch|soup soupe sopa Suppe
honey miel miel Honig|oil huile aceite Öl|coffee café café Kaffee|tea thé té Tee|beer bière cerveza Bier
cake gâteau - Kuchen|lamp lampe lámpara Lampe|mirror miroir espejo Spiegel|clock horloge reloj Uhr
bell cloche campana Glocke|candle bougie vela Kerze|pencil crayon lápiz Bleistift|paper papier papel Papier
newspaper journal periódico Zeitung|map carte mapa -|train train tren Zug|airplane avion avión Flugzeug
airport aéroport aeropuerto Flughafen|hospital hôpital hospital Krankenhaus|library bibliothèque biblioteca -
farm ferme granja Bauernhof|beach plage playa Strand|lake lac lago See|stone pierre piedra Stein|sand sable arena Sand
cloud nuage nube Wolke|ice glace hielo Eis|grass herbe - Gras|leaf feuille hoja Blatt|gold or oro Gold
week semaine semana Woche|month mois mes Monat|hour heure hora Stunde|autumn automne otoño Herbst
yellow jaune amarillo gelb|pink rose - -|cold froid frío kalt|long long largo lang|strong fort fuerte stark
heavy lourd pesado schwer|empty vide vacío leer|full plein lleno voll|rich riche rico reich|poor pauvre pobre arm
young jeune joven jung|slow lent lento langsam|dry sec seco trocken|two deux dos zwei|three trois tres drei
four quatre cuatro vier|five cinq cinco fünf|six six seis sechs|seven sept siete sieben|eight huit ocho acht
nine neuf nueve neun|ten dix diez zehn|Monday lundi lunes Montag|Tuesday mardi martes Dienstag
Wednesday mercredi miércoles Mittwoch|Thursday jeudi jueves Donnerstag|Friday vendredi viernes Freitag
Sunday dimanche domingo Sonntag|January janvier enero Januar|February février febrero Februar|March mars marzo März
April avril abril April|June juin junio Juni|July juillet julio Juli|August août agosto August
October octobre octubre Oktober|November novembre noviembre November|December décembre diciembre Dezember
son fils hijo Sohn|daughter fille hija Tochter|uncle oncle tío Onkel|aunt tante tía Tante
telephone téléphone teléfono Telefon|music musique música Musik|police police policía Polizei|war guerre guerra Krieg
peace paix paz Frieden|death mort muerte Tod|life vie vida Leben|word mot palabra Wort|name nom nombre Name
question question pregunta Frage|answer réponse respuesta Antwort|color couleur color Farbe|game jeu juego Spiel
dream rêve sueño Traum|voice voix voz Stimme|smoke fumée humo Rauch|shadow ombre sombra Schatten
dress robe vestido Kleid|coat manteau abrigo Mantel|glove gant guante Handschuh|price prix precio Preis
flour farine harina Mehl|hammer marteau martillo Hammer|needle aiguille aguja Nadel|pillow oreiller almohada -
soap savon jabón Seife|prince prince príncipe Prinz|princess princesse princesa Prinzessin
soldier soldat soldado Soldat|angel ange ángel Engel|island île - -|school école - -|shoe chaussure - -"""

FRESH_ANTONYMS = """heavy light|black white|male female|boy girl|husband wife|brother sister|father mother
son daughter|uncle aunt|nephew niece|king queen|yes no|on off|in out|over under|top bottom|front back|forward backward
come go|send receive|lend borrow|teach learn|attack defend|laugh cry|sit stand|build destroy|add subtract
multiply divide|plus minus|odd even|sunrise sunset|summer winter|war peace|life death|heaven hell|truth lie
pleasure pain|more less|most least|many few|everything nothing|everywhere nowhere|best worst|better worse|here there
near far|tight loose|raw cooked|married single|beautiful ugly|careful careless|honest dishonest|patient impatient
complete incomplete|able unable|known unknown|fair unfair|lucky unlucky|likely unlikely|usual unusual
logical illogical|regular irregular|responsible irresponsible|relevant irrelevant|mature immature|perfect imperfect
moral immoral|mortal immortal|formal informal|direct indirect|dependent independent|appear disappear|like dislike
connect disconnect|lock unlock|tie untie|pack unpack|load unload|fold unfold|employed unemployed|obey disobey
approve disapprove|inhale exhale|input output|internal external|interior exterior|upstairs downstairs|uphill downhill
upper lower|ascend descend|horizontal vertical|optimist pessimist|synonym antonym|singular plural|employer employee
host guest|predator prey|cause effect|problem solution|floor ceiling|profit loss|credit debit|permanent temporary
artificial natural|rural urban|superior inferior|majority minority|junior senior|dawn dusk|noon midnight
wealth poverty|strength weakness|lead follow|same different|pass fail|arrival departure|lengthen shorten|hire fire
presence absence|masculine feminine"""

FRESH_PLURALS = """door doors|floor floors|wall walls|room rooms|bed beds|lamp lamps|clock clocks|phone phones
desk desks|bag bags|coat coats|shoe shoes|sock socks|ring rings|coin coins|card cards|boat boats|train trains
plane planes|road roads|bridge bridges|tower towers|castle castles|village villages|town towns|farm farms|field fields
hill hills|lake lakes|cloud clouds|stone stones|rock rocks|plant plants|seed seeds|bone bones|hand hands
finger fingers|eye eyes|ear ears|nose noses|arm arms|leg legs|face faces|friend friends|sister sisters
brother brothers|uncle uncles|aunt aunts|cousin cousins|king kings|queen queens|student students|nurse nurses
driver drivers|singer singers|egg eggs|cake cakes|cookie cookies|lemon lemons|melon melons|carrot carrots|onion onions
bean beans|pear pears|grape grapes|snake snakes|frog frogs|duck ducks|pig pigs|goat goats|lion lions|tiger tigers
bear bears|rabbit rabbits|camel camels|whale whales|bee bees|spider spiders|bush bushes|wish wishes|match matches
beach beaches|peach peaches|lunch lunches|coach coaches|torch torches|dress dresses|boss bosses|tax taxes|inch inches
branch branches|couch couches|princess princesses|address addresses|sky skies|spy spies|cherry cherries|pony ponies
diary diaries|enemy enemies|library libraries|factory factories|memory memories|battery batteries|hobby hobbies
body bodies|copy copies|monkey monkeys|valley valleys|donkey donkeys|chimney chimneys|journey journeys|tray trays
holiday holidays|birthday birthdays|piano pianos|photo photos|radio radios|video videos|zoo zoos|kangaroo kangaroos
echo echoes|calf calves|loaf loaves|ox oxen"""

FRESH_PAST = """help helped|want wanted|look looked|ask asked|work worked|live lived|love loved|like liked|move moved
use used|need needed|start started|turn turned|show showed|happen happened|answer answered|wait waited|stay stayed
follow followed|visit visited|push pushed|pull pulled|kiss kissed|laugh laughed|climb climbed|paint painted
count counted|fill filled|kick kicked|pick picked|touch touched|wash washed|hope hoped|close closed|agree agreed
arrive arrived|believe believed|change changed|enjoy enjoyed|finish finished|kill killed|miss missed|pass passed
rest rested|return returned|explain explained|remember remembered|invite invited|decide decided|prefer preferred
admit admitted|drop dropped|shop shopped|hug hugged|rob robbed|beg begged|nod nodded|grab grabbed|rub rubbed
clap clapped|hurry hurried|worry worried|marry married|copy copied|reply replied|fry fried|bend bent|bleed bled
blow blew|breed bred|cling clung|creep crept|deal dealt|dig dug|draw drew|forgive forgave|grind ground|lay laid
lend lent|mean meant|rise rose|seek sought|shoot shot|slide slid|spin spun|stick stuck|sting stung|strike struck
swear swore|sweep swept|swing swung|weep wept|become became|bind bound|flee fled|get got|arise arose
understand understood|withdraw withdrew|sink sank"""

FRESH_WORDS = """blanket button cabbage carpet chicken cookie cousin curtain dolphin donkey eagle farmer finger
fountain garlic giraffe goblet hammock helmet jelly kettle kingdom lantern lizard magnet meadow medal muffin napkin
noodle orchard oyster paddle palace peanut pillow pirate pocket potato pumpkin quilt rainbow ribbon saucer scarf
season shovel sister soldier spoon squirrel statue sunset sweater table teapot thunder ticket toast towel turtle
umbrella unicorn velvet wagon walnut whistle yogurt bucket diamond elbow falcon garage igloo kitchen lobster marble
olive panda pebble salmon tablet tulip violet walrus banana biscuit canyon cereal compass crayon dentist glacier
lettuce necklace parcel sailor slipper spinach sponge stable tractor trumpet volcano waffle wheel zipper"""

ONES = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
        "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
TWO_WORD_KEYS = ("Saudi", "South", "North", "New Zealand", "Czech")


def _pairs(text: str) -> list[tuple[str, str]]:
    """``"key value|key value …"`` (newlines count as ``|``); two-word keys are listed in ``TWO_WORD_KEYS``."""
    out = []
    for item in text.replace("\n", "|").split("|"):
        words = item.split()
        k = 2 if item.startswith(TWO_WORD_KEYS) else 1
        out.append((" ".join(words[:k]), " ".join(words[k:])))
    return out


def _keyed(text: str) -> list[tuple[str, str]]:
    """``"key=value|key=value …"`` (newlines count as ``|``): keys and values of several words."""
    return [tuple(part.strip() for part in item.split("=", 1)) for item in text.replace("\n", "|").split("|")]


def _translations(column: int) -> list[tuple[str, str]]:
    """English word and its translation in ``FRESH_TRANSLATIONS``' ``column`` (1 French, 2 Spanish, 3 German)."""
    rows = [item.split() for item in FRESH_TRANSLATIONS.replace("\n", "|").split("|")]
    return [(row[0], row[column]) for row in rows if row[column] != "-"]


def _number_word(n: int) -> str:
    """Words for ``0 ≤ n < 100``, for the hundreds up to 900 and for ``k × 1000`` with ``k < 100``."""
    if n == 0:
        return "zero"
    if n >= 1000 and n % 1000 == 0:
        return _number_word(n // 1000) + " thousand"
    if n >= 100 and n % 100 == 0 and n < 1000:
        return ONES[n // 100] + " hundred"
    if not 0 < n < 100:
        raise ValueError(f"no words for {n} here (only 0-99, the hundreds and the thousands up to 99000)")
    return ONES[n] if n < 20 else TENS[n // 10] + ("-" + ONES[n % 10] if n % 10 else "")


def _task(name: str, kind: str, header: str, pairs: list[tuple[str, str]], seed: int, query: str = "{}:",
          balance=None, fresh: list[tuple[str, str]] = (), demos: list[tuple[str, str]] | None = None) -> dict:
    """Shuffle ``pairs`` with ``seed``; demonstrations in the instruction, then train and test queries.

    ``balance(answer)``: a key whose values the demonstrations hold in equal numbers (the first pairs of each
    value in shuffled order), so that the prompt does not teach a bias: ``add`` balances the answer's first
    digit being "1" (a two-digit sum) or not (issue 22: 7 of its 8 demonstrations began with "1").
    ``fresh``: new pairs for the fresh split (:func:`_fresh`), which comes after the other splits and leaves
    them as they are. ``demos``: the demonstrations, chosen by hand from the split's demonstrations and
    leftovers (never a train or test pair), in this order; the ones they replace join the leftovers, so train
    and test stay as they are.
    """
    keys = [q for q, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"task {name}: repeated queries")
    chosen = demos
    rng = random.Random(seed)
    pairs = pairs[:]
    rng.shuffle(pairs)
    if balance is not None:
        values = sorted({balance(a) for _, a in pairs})
        picked = [p for v in values for p in [p for p in pairs if balance(p[1]) == v][: N_DEMOS // len(values)]]
        pairs = [p for p in pairs if p in picked] + [p for p in pairs if p not in picked]  # picked in shuffled order
    train = pairs[N_DEMOS : N_DEMOS + N_TRAIN]
    test = pairs[N_DEMOS + N_TRAIN : N_DEMOS + N_TRAIN + N_TEST]
    left = pairs[N_DEMOS + N_TRAIN + N_TEST :]
    demos = pairs[:N_DEMOS] if chosen is None else list(chosen)
    if chosen is not None:
        if len(demos) != N_DEMOS or not all(p in pairs[:N_DEMOS] + left for p in demos):
            raise ValueError(f"task {name}: the demonstrations must be {N_DEMOS} of its demonstrations and leftovers")
        left = [p for p in left + pairs[:N_DEMOS] if p not in demos]
    if len(test) < MIN_TEST:
        raise ValueError(f"task {name}: {len(pairs)} pairs leave {len(test)} test queries (< {MIN_TEST})")
    instruction = header + "".join(f"{query.format(q)} {a}\n" for q, a in demos)
    item = lambda q, a: {"query": query.format(q), "answer": a}  # noqa: E731
    out = {"name": name, "kind": kind, "instruction": instruction, "train": [item(*p) for p in train],
           "test": [item(*p) for p in test]}
    if fresh:
        out["fresh"] = [item(*p) for p in _fresh(name, kind, demos + train + test, left, list(fresh), seed)]
    return out


def _fresh(name: str, kind: str, used: list, left: list, new: list, seed: int) -> list[tuple[str, str]]:
    """The fresh split: ``left`` (the task's pairs no other split took, less ``FRESH_DROP``), then ``new``
    shuffled with ``seed + FRESH_SEED``, the first ``N_FRESH``. A ``new`` pair must share no query with the
    task's own pairs (and, for the word transformations, no word; for capitals, no answer): the lists are
    written to be apart."""
    own = used + left
    left = [p for p in left if p[0] not in FRESH_DROP.get(name, ())]
    if len({q for q, _ in new}) != len(new):
        raise ValueError(f"task {name}: repeated fresh queries")
    words = lambda ps: {w for p in ps for w in " ".join(p).split()}  # noqa: E731
    for q, a in new:
        if q in {k for k, _ in own}:
            raise ValueError(f"task {name}: fresh query {q!r} is one of the task's own pairs")
        if kind == "word transformation" and words([(q, a)]) & words(own):
            raise ValueError(f"task {name}: fresh pair {q!r} -> {a!r} shares a word with the task's own pairs")
        if name == "capitals" and a in {v for _, v in own}:
            raise ValueError(f"task {name}: fresh answer {a!r} is an answer of the task's own pairs")
    random.Random(seed + FRESH_SEED).shuffle(new)
    fresh = (left + new)[:N_FRESH]
    if (len(fresh) < N_FRESH) != (name in FEWER_FRESH):
        raise ValueError(f"task {name}: {len(fresh)} fresh pairs, and FEWER_FRESH "
                         f"{'does not list' if len(fresh) < N_FRESH else 'lists'} the task")
    return fresh


# add's demonstrations (issue 22): the balanced split above still left three sums starting "2 +" and three ending
# "+ 5" (the prompt lowered SmolLM2's accuracy: none 94% > full 75% on test). These 8 come from the split's
# demonstrations and leftovers: 4 one-digit and 4 two-digit sums, every first addend different, distinct answers
# (one repeated second addend is unavoidable there); of the first three such sets in enumeration order, the one with
# the highest full-prompt accuracy on the train queries, both models (SmolLM2 53/66/56%, Gemma 59/75/75%; the old
# prompt 59% and 69%), in a seeded order. SmolLM2 still answers the train queries better alone (88%); its chat
# template does worse (0 of 32 train queries: "The answer is 10").
ADD_DEMOS = ((7, 7), (2, 5), (1, 5), (6, 9), (9, 8), (4, 1), (8, 3), (3, 6))


def _sums() -> list[tuple[str, str]]:
    """``a + b`` for every one-digit ``a, b ≥ 1`` (both orders)."""
    return [(f"{a} + {b}", str(a + b)) for a in range(1, 10) for b in range(1, 10)]


def _successors() -> list[tuple[str, str]]:
    """``n`` → ``n + 1`` for two-digit ``n``."""
    return [(str(n), str(n + 1)) for n in range(10, 99)]


def _fresh_sums() -> list[tuple[str, str]]:
    """Fresh ``add`` past the one-digit range: a number from 10 to 19 and a one-digit number, either order."""
    return [(f"{a} + {b}", str(a + b)) for t in range(10, 20) for d in range(1, 10) for a, b in ((t, d), (d, t))]


def _fresh_numbers() -> list[int]:
    """Fresh ``number_words`` past 1-99: zero, the hundreds and the thousands (no optional "and" in their words)."""
    return [0, *range(100, 1000, 100), *range(1000, 100_000, 1000)]


def tasks() -> list[dict]:
    """Every shipped task, deterministically (fixed seeds)."""
    words = WORDS.split()
    return [
        _task("add", "arithmetic", "Add the two numbers.\n", _sums(), 21, "{} =", balance=lambda a: a.startswith("1"),
              fresh=_fresh_sums(), demos=[(f"{a} + {b}", str(a + b)) for a, b in ADD_DEMOS]),
        _task("plus_one", "arithmetic", "Each number is followed by the next number.\n", _successors(), 22,
              fresh=[(str(n), str(n + 1)) for n in range(99, 999)]),
        _task("antonyms", "word transformation", "Each word is followed by its opposite.\n", _pairs(ANTONYMS), 31,
              fresh=_pairs(FRESH_ANTONYMS)),
        _task("plural", "word transformation", "Each noun is followed by its plural.\n", _pairs(PLURALS), 32,
              fresh=_pairs(FRESH_PLURALS)),
        _task("past_tense", "word transformation", "Each verb is followed by its past tense.\n", _pairs(PAST), 33,
              fresh=_pairs(FRESH_PAST)),
        _task("en_fr", "translation", "English words and their French translations.\n", _pairs(FRENCH), 2,
              fresh=_translations(1)),
        _task("en_es", "translation", "English words and their Spanish translations.\n", _pairs(SPANISH), 3,
              fresh=_translations(2)),
        _task("en_de", "translation", "English words and their German translations.\n", _pairs(GERMAN), 4,
              fresh=_translations(3)),
        _task("capitals", "factual lookup", "Each country is followed by its capital city.\n", _pairs(CAPITALS), 1,
              fresh=_keyed(FRESH_CAPITALS)),
        _task("languages", "factual lookup", "Each country is followed by its main language.\n", _pairs(LANGUAGES), 41,
              fresh=_keyed(FRESH_LANGUAGES)),
        _task("uppercase", "format", "Each word is written again in capital letters.\n",
              [(w, w.upper()) for w in words], 51, fresh=[(w, w.upper()) for w in FRESH_WORDS.split()]),
        _task("number_words", "format", "Each number is written out in words.\n",
              [(str(n), _number_word(n)) for n in range(1, 100)], 52,
              fresh=[(str(n), _number_word(n)) for n in _fresh_numbers()]),
    ]


def _made_up_keys(k: int, rng: random.Random) -> list[str]:
    cons, vows = "bdfgklmnprstvz", "aeiou"
    keys: list[str] = []
    while len(keys) < k:
        w = rng.choice(cons) + rng.choice(vows) + rng.choice(cons) + rng.choice(vows)
        if w not in keys:
            keys.append(w)
    return keys


KV_TRAIN_LEADS = ["code ", "key ", "item ", "entry ", "word ", "name ", "tag ", "id "]
KV_TEST_LEADS = [""]  # the instruction's own format, "key:"; never a calibration string


def _dictionary(k: int, seed: int) -> dict:
    """A key–value table of ``k`` made-up keys (the paper's new-knowledge task); train queries carry a lead word."""
    rng = random.Random(seed)
    keys = _made_up_keys(k, rng)
    values = [str(v) for v in rng.sample(range(10, 100), k)]
    instruction = "Secret codes (memorise them):\n" + "".join(f"{key}: {v}\n" for key, v in zip(keys, values))
    item = lambda lead, key, v: {"query": f"{lead}{key}:", "answer": v}  # noqa: E731
    train = [item(lead, key, v) for lead in KV_TRAIN_LEADS for key, v in zip(keys, values)][:N_TRAIN]
    test = [item(lead, key, v) for lead in KV_TEST_LEADS for key, v in zip(keys, values)][:24]
    return {"name": f"kv{k}", "instruction": instruction, "train": train, "test": test}


def extra_tasks() -> list[dict]:
    """Not in the thought-patch suite (8 test queries): the key–value table ``kv8`` that
    ``experiments.finetune_alignment`` reads."""
    return [_dictionary(8, 18)]


def task_line(task: dict) -> str:
    """A task file's one line: the task, led by the command that wrote it (``generated_by``, which
    :func:`icl_lens.thought.tasks.load_task` ignores)."""
    return json.dumps({"generated_by": GENERATED_BY, **task}, ensure_ascii=False) + "\n"


def build() -> list[Path]:
    paths = []
    for task in [*tasks(), *extra_tasks()]:
        path = TASK_DIR / f"{task['name']}.jsonl"
        path.write_text(task_line(task), encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in build():
        print(p)
