"""Regenerate the shipped thought-patch tasks: ``python -m icl_lens.thought.tasks.build_tasks``.

Each task is one JSON object on one line (``<name>.jsonl``): ``{"name", "instruction",
"train": [{"query", "answer"}], "test": [...]}``. The instruction is a few-shot prompt;
train queries are the calibration set of the thought patch, test queries are held out.
Lookup tasks (capitals, translations) split their pairs; the synthetic key–value
dictionaries state all k made-up pairs in the instruction and ask for the keys in
with a lead word for train (``code blor:``) and bare as in the instruction for test
(``blor:``); no test string is a calibration string.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
N_DEMOS, N_TRAIN, N_TEST = 8, 32, 24

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

KV_TRAIN_LEADS = ["code ", "key ", "item ", "entry ", "word ", "name ", "tag ", "id "]
KV_TEST_LEADS = [""]  # the instruction's own format, "key:"; never a calibration string


def _pairs(text: str) -> list[tuple[str, str]]:
    out = []
    for item in text.replace("\n", "|").split("|"):
        words = item.split()
        if item.startswith(("Saudi", "South", "North", "New Zealand", "Czech")):
            k = 2
        else:
            k = 1
        out.append((" ".join(words[:k]), " ".join(words[k:])))
    return out


def _lookup(name: str, header: str, pairs: list[tuple[str, str]], seed: int) -> dict:
    rng = random.Random(seed)
    pairs = pairs[:]
    rng.shuffle(pairs)
    demos, rest = pairs[:N_DEMOS], pairs[N_DEMOS:]
    train, test = rest[:N_TRAIN], rest[N_TRAIN : N_TRAIN + N_TEST]
    instruction = header + "".join(f"{q}: {a}\n" for q, a in demos)
    item = lambda q, a: {"query": f"{q}:", "answer": a}  # noqa: E731
    return {"name": name, "instruction": instruction, "train": [item(*p) for p in train],
            "test": [item(*p) for p in test]}


def _made_up_keys(k: int, rng: random.Random) -> list[str]:
    cons, vows = "bdfgklmnprstvz", "aeiou"
    keys: list[str] = []
    while len(keys) < k:
        w = rng.choice(cons) + rng.choice(vows) + rng.choice(cons) + rng.choice(vows)
        if w not in keys:
            keys.append(w)
    return keys


def _dictionary(k: int, seed: int) -> dict:
    rng = random.Random(seed)
    keys = _made_up_keys(k, rng)
    values = [str(v) for v in rng.sample(range(10, 100), k)]
    instruction = "Secret codes (memorise them):\n" + "".join(f"{key}: {v}\n" for key, v in zip(keys, values))
    item = lambda lead, key, v: {"query": f"{lead}{key}:", "answer": v}  # noqa: E731
    train = [item(lead, key, v) for lead in KV_TRAIN_LEADS for key, v in zip(keys, values)][:N_TRAIN]
    test = [item(lead, key, v) for lead in KV_TEST_LEADS for key, v in zip(keys, values)][:N_TEST]
    return {"name": f"kv{k}", "instruction": instruction, "train": train, "test": test}


def build() -> list[Path]:
    tasks = [
        _lookup("capitals", "Each country is followed by its capital city.\n", _pairs(CAPITALS), 1),
        _lookup("en_fr", "English words and their French translations.\n", _pairs(FRENCH), 2),
        _lookup("en_es", "English words and their Spanish translations.\n", _pairs(SPANISH), 3),
        *[_dictionary(k, 10 + k) for k in (4, 8, 16, 32)],
    ]
    paths = []
    for task in tasks:
        path = HERE / f"{task['name']}.jsonl"
        path.write_text(json.dumps(task, ensure_ascii=False) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in build():
        print(p)
