"""``python -m experiments.build_locality``: the locality set nobody tuned on (issue 38), written once.

Writes :data:`LOCALITY_SET` (``experiments/data/locality_untouched.json``), read only by the locality rows of
``python -m experiments.thought --method`` (``experiments/thought/method.py``): never by a selection stage, never by
the preserve texts a fit reads (``icl_lens.thought.preserve_texts``), never by the library's default locality probe
(``icl_lens/thought/tasks/locality.json``). ``tests/test_thought_locality_set.py`` checks that, and that no text
overlaps the preserve set or uses its templates.

- ``formats``: unrelated text in four formats the preserve set does not use (its texts are the models' free samples
  after BOS and one-line few-shot demonstrations): prose, code, dialogue, tables and lists. Written by hand, here.
- ``tasks``: four few-shot tasks in templates the preserve prompts do not use (theirs: a header "Each X is followed
  by …" or a question, then ``x: y``, ``x -> y``, ``x = y``, ``Q:``/``A:`` or ``Input:``/``Output:`` lines): a Python
  session, a sentence frame, a JSON record and a bracketed list. Their demonstrations and queries are generated here
  from fixed lists with a fixed seed (no network), so the file is the same on every run. The measure is agreement
  with the unpatched model's own answer, so a task need not be one the model solves.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

LOCALITY_SET = Path(__file__).parent / "data" / "locality_untouched.json"
SEED = 38
N_DEMOS, N_QUERIES = 4, 12  # four demonstrations: the tiny test models read 256 byte tokens

FORMATS = {
    "prose": [
        "The harbour was quiet that winter, and the fishing boats stayed tied to the pier for weeks at a time.",
        "Glaciers move slowly downhill under their own weight, grinding the rock beneath them into fine powder.",
        "After the storm the village council voted to rebuild the bridge with stone instead of timber.",
        "Most of the letters in the archive were never sent; they were drafts the poet rewrote many times.",
        "The market opens before dawn, when the farmers arrive with crates of cabbages, eggs and cheese.",
        "A lighthouse keeper once had to climb the tower stairs several times each night to wind the lamp.",
    ],
    "code": [
        "import os\n\nfor name in sorted(os.listdir('.')):\n    if name.endswith('.txt'):\n        print(name)\n",
        "function total(items) {\n  let sum = 0;\n  for (const item of items) {\n    sum += item.price;\n  }\n"
        "  return sum;\n}\n",
        "SELECT name, COUNT(*) AS orders\nFROM customers JOIN orders ON customers.id = orders.customer_id\n"
        "GROUP BY name\nORDER BY orders DESC;\n",
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
        "        self.items.append(item)\n",
        "#include <stdio.h>\n\nint main(void) {\n    for (int i = 0; i < 3; i++) {\n        printf(\"%d\\n\", i);\n"
        "    }\n    return 0;\n}\n",
        "while read -r line; do\n  echo \"$line\" | tr '[:lower:]' '[:upper:]'\ndone < notes.txt\n",
    ],
    "dialogue": [
        "Nurse: How did you sleep last night?\nPatient: Badly, the room was too warm.\n"
        "Nurse: I'll open the window a little.",
        "Customer: Excuse me, does this bus stop at the museum?\nDriver: Two stops after the bridge.\n"
        "Customer: Thank you so much.",
        "Teacher: Who can tell me why the ice melted?\nStudent: Because the sun warmed the tray.\n"
        "Teacher: Good, and what happened to the water?",
        "Mira: Did you finish the report?\nJonas: Almost, I still need the figures from March.\n"
        "Mira: I'll send them this afternoon.",
        "Guide: On your left is the old town hall.\nVisitor: When was it built?\n"
        "Guide: Around 1620, after the great fire.",
        "Chef: Taste this sauce and tell me what it needs.\nApprentice: Maybe a little more lemon.\n"
        "Chef: Exactly what I thought.",
    ],
    "table_or_list": [
        "| city | population | river |\n|---|---|---|\n| Vienna | 1.9 million | Danube |\n"
        "| Prague | 1.3 million | Vltava |\n| Warsaw | 1.8 million | Vistula |\n",
        "Groceries for the weekend:\n- two loaves of bread\n- a dozen eggs\n- tomatoes\n- washing-up liquid\n- coffee beans\n",
        "| day | high | low |\n|---|---|---|\n| Monday | 14 | 6 |\n| Tuesday | 12 | 5 |\n| Wednesday | 15 | 8 |\n",
        "Packing checklist\n1. sleeping bag\n2. head torch\n3. water filter\n4. spare socks\n5. map of the valley\n",
        "| item | qty | price |\n|---|---|---|\n| pencils | 12 | 3.00 |\n| notebooks | 4 | 6.40 |\n"
        "| erasers | 6 | 1.20 |\n",
        "Agenda\n* welcome and introductions\n* review of last quarter\n* budget for the new lab\n"
        "* any other business\n",
    ],
}

ROMAN = ["", "I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X", "XI", "XII", "XIII", "XIV", "XV", "XVI",
         "XVII", "XVIII", "XIX", "XX", "XXI", "XXII", "XXIII", "XXIV", "XXV"]
FRUITS = ["apple", "pear", "plum", "cherry", "mango", "peach", "grape", "lemon", "melon", "apricot"]
VEGETABLES = ["carrot", "potato", "onion", "leek", "cabbage", "turnip", "celery", "spinach", "radish", "pepper"]
LEGS = {"spider": 8, "dog": 4, "hen": 2, "ant": 6, "horse": 4, "crab": 10, "duck": 2, "beetle": 6, "cat": 4,
        "octopus": 8, "goose": 2, "mouse": 4, "fly": 6, "sheep": 4, "robin": 2, "scorpion": 8, "frog": 4, "bee": 6}


def _tasks(rng: random.Random) -> list[dict]:
    """Four few-shot tasks: demonstrations (the instruction) and queries, drawn without overlap."""
    tasks = []
    pairs = [(a, b) for a in range(1, 30) for b in range(1, 30) if a != b]
    picked = rng.sample(pairs, N_DEMOS + N_QUERIES)
    tasks.append({"name": "python_max", "template": ">>> max(a, b) then the value on the next line",
                  "instruction": "".join(f">>> max({a}, {b})\n{max(a, b)}\n" for a, b in picked[:N_DEMOS]),
                  "prompts": [f">>> max({a}, {b})\n" for a, b in picked[N_DEMOS:]]})
    numbers = rng.sample(range(1, len(ROMAN)), N_DEMOS + N_QUERIES)
    tasks.append({"name": "roman_sentence", "template": "a sentence frame: 'The Roman numeral for n is R.'",
                  "instruction": "".join(f"The Roman numeral for {n} is {ROMAN[n]}.\n" for n in numbers[:N_DEMOS]),
                  "prompts": [f"The Roman numeral for {n} is" for n in numbers[N_DEMOS:]]})
    animals = rng.sample(sorted(LEGS), N_DEMOS + N_QUERIES)
    tasks.append({"name": "json_legs", "template": "a JSON record per line",
                  "instruction": "".join(f'{{"animal": "{a}", "legs": {LEGS[a]}}}\n' for a in animals[:N_DEMOS]),
                  "prompts": [f'{{"animal": "{a}", "legs":' for a in animals[N_DEMOS:]]})
    rows = []
    for _ in range(N_DEMOS + N_QUERIES):
        fruit, veg = rng.choice(FRUITS), rng.sample(VEGETABLES, 2)
        items = [fruit, *veg]
        rng.shuffle(items)
        rows.append((items, fruit))
    tasks.append({"name": "bracket_fruit", "template": "a bracketed list, then 'fruit ⇒' and the fruit in it",
                  "instruction": "".join(f"[{', '.join(i)}] fruit ⇒ {f}\n" for i, f in rows[:N_DEMOS]),
                  "prompts": [f"[{', '.join(i)}] fruit ⇒" for i, _ in rows[N_DEMOS:]]})
    return tasks


def build() -> dict:
    return {
        "about": "The locality set nobody tuned on (issue 38), written by `python -m experiments.build_locality`: "
                 "unrelated text in four formats and four few-shot tasks in templates the preserve texts do not use. "
                 "Read only by the locality rows of `python -m experiments.thought --method`; never by a selection "
                 "stage or the preserve texts.",
        "generated_by": "python -m experiments.build_locality", "seed": SEED,
        "formats": FORMATS, "tasks": _tasks(random.Random(SEED)),
    }


def main() -> int:
    LOCALITY_SET.parent.mkdir(parents=True, exist_ok=True)
    LOCALITY_SET.write_text(json.dumps(build(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    data = build()
    print(f"wrote {LOCALITY_SET}: {sum(map(len, data['formats'].values()))} texts in {len(data['formats'])} formats, "
          f"{len(data['tasks'])} tasks of {N_QUERIES} queries")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
