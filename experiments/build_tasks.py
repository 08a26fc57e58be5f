"""Regenerate the shipped thought-patch tasks: ``python -m experiments.build_tasks``.

Each task is one JSON object on one line (``<name>.jsonl``): ``{"name", "kind",
"instruction", "train": [{"query", "answer"}], "test": [...]}``. The instruction is a
few-shot prompt (a header line and ``N_DEMOS`` solved examples, one per line); the
remaining examples are shuffled with the task's own seed and split into ``N_TRAIN``
calibration queries (train) and up to ``N_TEST`` held-out queries (test, at least
``MIN_TEST``). No query string is in two of the three parts. Every query is written
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


def _number_word(n: int) -> str:
    return ONES[n] if n < 20 else TENS[n // 10] + ("-" + ONES[n % 10] if n % 10 else "")


def _task(name: str, kind: str, header: str, pairs: list[tuple[str, str]], seed: int, query: str = "{}:",
          balance=None) -> dict:
    """Shuffle ``pairs`` with ``seed``; demonstrations in the instruction, then train and test queries.

    ``balance(answer)``: a key whose values the demonstrations hold in equal numbers (the first pairs of each
    value in shuffled order), so that the prompt does not teach a bias: ``add`` balances the answer's first
    digit being "1" (a two-digit sum) or not (issue 22: 7 of its 8 demonstrations began with "1").
    """
    keys = [q for q, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"task {name}: repeated queries")
    rng = random.Random(seed)
    pairs = pairs[:]
    rng.shuffle(pairs)
    if balance is not None:
        values = sorted({balance(a) for _, a in pairs})
        picked = [p for v in values for p in [p for p in pairs if balance(p[1]) == v][: N_DEMOS // len(values)]]
        demos = [p for p in pairs if p in picked]  # in shuffled order
        pairs = demos + [p for p in pairs if p not in picked]
    demos, train = pairs[:N_DEMOS], pairs[N_DEMOS : N_DEMOS + N_TRAIN]
    test = pairs[N_DEMOS + N_TRAIN : N_DEMOS + N_TRAIN + N_TEST]
    if len(test) < MIN_TEST:
        raise ValueError(f"task {name}: {len(pairs)} pairs leave {len(test)} test queries (< {MIN_TEST})")
    instruction = header + "".join(f"{query.format(q)} {a}\n" for q, a in demos)
    item = lambda q, a: {"query": query.format(q), "answer": a}  # noqa: E731
    return {"name": name, "kind": kind, "instruction": instruction, "train": [item(*p) for p in train],
            "test": [item(*p) for p in test]}


def _sums() -> list[tuple[str, str]]:
    """``a + b`` for every one-digit ``a, b ≥ 1`` (both orders)."""
    return [(f"{a} + {b}", str(a + b)) for a in range(1, 10) for b in range(1, 10)]


def _successors() -> list[tuple[str, str]]:
    """``n`` → ``n + 1`` for two-digit ``n``."""
    return [(str(n), str(n + 1)) for n in range(10, 99)]


def tasks() -> list[dict]:
    """Every shipped task, deterministically (fixed seeds)."""
    words = WORDS.split()
    return [
        _task("add", "arithmetic", "Add the two numbers.\n", _sums(), 21, "{} =", balance=lambda a: a.startswith("1")),
        _task("plus_one", "arithmetic", "Each number is followed by the next number.\n", _successors(), 22),
        _task("antonyms", "word transformation", "Each word is followed by its opposite.\n", _pairs(ANTONYMS), 31),
        _task("plural", "word transformation", "Each noun is followed by its plural.\n", _pairs(PLURALS), 32),
        _task("past_tense", "word transformation", "Each verb is followed by its past tense.\n", _pairs(PAST), 33),
        _task("en_fr", "translation", "English words and their French translations.\n", _pairs(FRENCH), 2),
        _task("en_es", "translation", "English words and their Spanish translations.\n", _pairs(SPANISH), 3),
        _task("en_de", "translation", "English words and their German translations.\n", _pairs(GERMAN), 4),
        _task("capitals", "factual lookup", "Each country is followed by its capital city.\n", _pairs(CAPITALS), 1),
        _task("languages", "factual lookup", "Each country is followed by its main language.\n", _pairs(LANGUAGES), 41),
        _task("uppercase", "format", "Each word is written again in capital letters.\n",
              [(w, w.upper()) for w in words], 51),
        _task("number_words", "format", "Each number is written out in words.\n",
              [(str(n), _number_word(n)) for n in range(1, 100)], 52),
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
