"""Few-shot prompts a thought patch must leave as they are: the second half of its preserve texts (issue 22).

A thought patch is fitted on queries read *without* an instruction. The model's own samples from BOS
(:mod:`icl_lens.thought._preserve`) cover general text, but hardly ever a few-shot prompt, so a fit that
preserves only them is free to change what the model computes at the positions where a prompt's
demonstrations and queries sit (measured, SmolLM2-135M capitals: the edited model kept 22% of another
few-shot task's answers). The prompts here are those positions: ``N_TASKS`` small tasks, each a header
line and ``len(pairs)`` solved examples in one of ``FORMATS``, every token of which becomes a preserved key.

They are apart from the locality measure: no task is a shipped task or the measure's other task (colours),
no text is a locality text, and no example's input or output is an item of the other task (:func:`check`,
run by ``python -m experiments.thought.preserve_samples``, which writes them to
``icl_lens/thought/tasks/preserve/few_shot.json``). Tasks alternate between the ``fit`` half (even
positions) and the ``held_out`` half (odd positions), so that both halves hold every format.
"""
from __future__ import annotations

FORMATS = ("{}: {}", "{} -> {}", "Q: {}\nA: {}", "{} = {}", "Input: {}\nOutput: {}")

# (header, [(input, output), ...]); the format of task i is FORMATS[i % len(FORMATS)].
TASKS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("Each animal is followed by the sound it makes.",
     (("dog", "bark"), ("cat", "meow"), ("cow", "moo"), ("duck", "quack"), ("sheep", "baa"), ("lion", "roar"),
      ("owl", "hoot"), ("horse", "neigh"))),
    ("Each word is followed by its first letter.",
     (("apple", "a"), ("house", "h"), ("river", "r"), ("train", "t"), ("music", "m"), ("garden", "g"),
      ("window", "w"), ("bottle", "b"))),
    ("What is twice the number?",
     (("3", "6"), ("7", "14"), ("12", "24"), ("5", "10"), ("21", "42"), ("9", "18"), ("15", "30"), ("40", "80"))),
    ("Each chemical element is followed by its symbol.",
     (("oxygen", "O"), ("iron", "Fe"), ("gold", "Au"), ("carbon", "C"), ("sodium", "Na"), ("helium", "He"),
      ("silver", "Ag"), ("copper", "Cu"))),
    ("Each month is followed by the month after it.",
     (("January", "February"), ("March", "April"), ("July", "August"), ("October", "November"), ("May", "June"),
      ("December", "January"), ("April", "May"), ("August", "September"))),
    ("Each adjective is followed by its comparative.",
     (("big", "bigger"), ("small", "smaller"), ("good", "better"), ("fast", "faster"), ("happy", "happier"),
      ("bad", "worse"), ("tall", "taller"), ("cold", "colder"))),
    ("Each city is followed by the country it is in.",
     (("Lyon", "France"), ("Osaka", "Japan"), ("Munich", "Germany"), ("Toronto", "Canada"), ("Milan", "Italy"),
      ("Seville", "Spain"), ("Porto", "Portugal"), ("Chicago", "United States"))),
    ("Each job is followed by a tool it uses.",
     (("carpenter", "hammer"), ("painter", "brush"), ("chef", "knife"), ("doctor", "stethoscope"),
      ("gardener", "shovel"), ("writer", "pen"), ("tailor", "needle"), ("fisherman", "net"))),
    ("What is the young of this animal called?",
     (("cat", "kitten"), ("dog", "puppy"), ("cow", "calf"), ("sheep", "lamb"), ("horse", "foal"),
      ("goose", "gosling"), ("bear", "cub"), ("kangaroo", "joey"))),
    ("Each shape is followed by its number of sides.",
     (("triangle", "3"), ("square", "4"), ("pentagon", "5"), ("hexagon", "6"), ("octagon", "8"),
      ("rectangle", "4"), ("heptagon", "7"), ("decagon", "10"))),
    ("Each letter is followed by its position in the alphabet.",
     (("c", "3"), ("a", "1"), ("k", "11"), ("e", "5"), ("z", "26"), ("m", "13"), ("b", "2"), ("t", "20"))),
    ("Each word is followed by its number of letters.",
     (("tree", "4"), ("ocean", "5"), ("pencil", "6"), ("at", "2"), ("mountain", "8"), ("sun", "3"),
      ("library", "7"), ("blanket", "7"))),
    ("Which day comes before this one?",
     (("Tuesday", "Monday"), ("Friday", "Thursday"), ("Sunday", "Saturday"), ("Wednesday", "Tuesday"),
      ("Monday", "Sunday"), ("Saturday", "Friday"), ("Thursday", "Wednesday"))),
    ("Each planet is followed by its place from the Sun.",
     (("Mercury", "1"), ("Venus", "2"), ("Earth", "3"), ("Mars", "4"), ("Jupiter", "5"), ("Saturn", "6"),
      ("Uranus", "7"), ("Neptune", "8"))),
    ("Each animal is followed by where it lives.",
     (("fish", "water"), ("camel", "desert"), ("penguin", "ice"), ("monkey", "jungle"), ("bee", "hive"),
      ("bat", "cave"), ("mole", "ground"), ("whale", "ocean"))),
    ("Each instrument is followed by its family.",
     (("violin", "strings"), ("trumpet", "brass"), ("flute", "woodwind"), ("drum", "percussion"),
      ("cello", "strings"), ("tuba", "brass"), ("clarinet", "woodwind"), ("cymbal", "percussion"))),
    ("Each sport is followed by what it is played with.",
     (("tennis", "racket"), ("golf", "club"), ("baseball", "bat"), ("hockey", "stick"), ("badminton", "shuttlecock"),
      ("soccer", "ball"), ("archery", "bow"), ("fencing", "sword"))),
    ("Each book is followed by its author.",
     (("Hamlet", "Shakespeare"), ("Emma", "Austen"), ("Ulysses", "Joyce"), ("Dracula", "Stoker"),
      ("Frankenstein", "Shelley"), ("Walden", "Thoreau"), ("Beloved", "Morrison"), ("Lolita", "Nabokov"))),
    ("Subtract the second number from the first.",
     (("9 - 4", "5"), ("7 - 2", "5"), ("8 - 8", "0"), ("6 - 1", "5"), ("9 - 7", "2"), ("5 - 3", "2"),
      ("8 - 4", "4"), ("7 - 6", "1"))),
    ("Each word is followed by the word spelled backwards.",
     (("cat", "tac"), ("star", "rats"), ("drawer", "reward"), ("stop", "pots"), ("live", "evil"),
      ("time", "emit"), ("part", "trap"), ("net", "ten"))),
    ("Each word is followed by a word that rhymes with it.",
     (("cat", "hat"), ("moon", "spoon"), ("tree", "bee"), ("cake", "lake"), ("king", "ring"), ("rain", "train"),
      ("bell", "shell"), ("goat", "boat"))),
    ("Each unit is followed by its abbreviation.",
     (("kilogram", "kg"), ("centimetre", "cm"), ("second", "s"), ("litre", "L"), ("kilometre", "km"),
      ("milligram", "mg"), ("hour", "h"), ("metre", "m"))),
    ("Answer each question with one word.",
     (("How many legs does a spider have?", "eight"), ("What do bees make?", "honey"),
      ("What falls from clouds?", "rain"), ("What do you sleep in?", "bed"), ("What do cows drink?", "water"),
      ("What season comes after winter?", "spring"), ("What do you write with?", "pen"),
      ("What shines at night?", "moon"))),
    ("Each vehicle is followed by where it travels.",
     (("car", "road"), ("ferry", "water"), ("plane", "air"), ("train", "rails"), ("submarine", "underwater"),
      ("bicycle", "road"), ("rocket", "space"), ("canoe", "river"))),
)
N_TASKS = len(TASKS)


def text(i: int) -> str:
    """Task ``i`` as a few-shot prompt: its header, then one solved example per line, in its format."""
    header, pairs = TASKS[i]
    fmt = FORMATS[i % len(FORMATS)]
    return header + "\n" + "".join(fmt.format(a, b) + "\n" for a, b in pairs)


def texts() -> list[str]:
    """Every task's prompt, in order (even positions: the fit half; odd: the held-out half)."""
    return [text(i) for i in range(N_TASKS)]


def check(locality_texts: set[str], other_items: set[str]) -> None:
    """Refuse a prompt that meets the locality measure: a locality text, or an example whose input or output is
    an item of the other task (its queries and its demonstrations, ``other_items``).

    Words shared with the shipped tasks' queries are allowed: a preserved key can only hold the edit back where it
    sits, so it may cost the patch accuracy but cannot flatter it; it is the locality measure that preserving its
    own items would flatter.
    """
    for i, (header, pairs) in enumerate(TASKS):
        for a, b in pairs:
            if a in other_items or b in other_items:
                raise ValueError(f"few-shot preserve task {i} ({header!r}): {a!r} -> {b!r} is an item of the "
                                 "locality measure's other task")
        if text(i) in locality_texts:
            raise ValueError(f"few-shot preserve task {i} is a locality text")
