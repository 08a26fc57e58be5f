"""The thought evaluation's fixed settings: the paper's, the selection grids, the target rule."""
from __future__ import annotations

SIZES = (1, 2, 4, 8, 16, 32)
COMMAND = "python -m experiments.thought"
PAPER = {"kind": "both", "ridge": 0.0, "query_prefix": "", "answer_tokens": 0}  # Algorithm 1 as published
CURVE_TASKS = ("capitals", "antonyms")
SELECT_TASKS = ("capitals", "antonyms", "plus_one", "en_fr")
SELECT_GRID = (
    {"kind": "both", "ridge": 0.0, "query_prefix": ""},
    {"kind": "both", "ridge": 0.5, "query_prefix": "\n"},
    {"kind": "both+down", "ridge": 0.0, "query_prefix": "\n"},
    {"kind": "both+down", "ridge": 0.5, "query_prefix": "\n"},
    {"kind": "both+down", "ridge": 2.0, "query_prefix": "\n"},
    {"kind": "both+down", "ridge": 8.0, "query_prefix": "\n"},
    {"kind": "both+down", "ridge": 0.5, "query_prefix": ""},
)
# Measured on the first selection task only (cost), shown beside the grid, not eligible for the choice.
SELECT_EXTRA = ({"kind": "both+down", "ridge": 0.5, "query_prefix": "\n", "eta": 0.5, "iterations": 2},)
# Second stage: the first stage's winner with answer-token rows (answer_tokens), and the ridge again (more rows),
# scored at the answer's positions (the full model's own answer, at most SCORE_ANSWER_TOKENS tokens, teacher
# forced). Each entry overrides the first stage's setting.
STAGE_ONE = SELECT_GRID[4]  # the first stage's lowest setting (the report says whether it still is)
SELECT_ANSWER_GRID = ({"answer_tokens": 0}, {"answer_tokens": 4}, {"answer_tokens": 8},
                      {"answer_tokens": 8, "ridge": 0.5}, {"answer_tokens": 8, "ridge": 8.0},
                      {"answer_tokens": 8, "ridge": 32.0}, {"answer_tokens": 8, "ridge": 128.0})
SCORE_ANSWER_TOKENS = 8
SELECT_FIT, SELECT_VALIDATE = 24, 8
# Third stage: the second stage's winner fitted with and without preserve rows (the first PRESERVE_FIT preserve
# texts of the locality file), scored by the answer KL of the held-out train queries and by the next-token KL on
# the other preserve texts (never the locality measure's own texts). Preserve rows join the default when they lower
# that text KL and raise the mean answer KL by at most PRESERVE_TOLERANCE (relative).
PRESERVE_FIT, PRESERVE_TOLERANCE = 8, 0.10
PATCH_CONDITIONS = ("patched", "control")  # what a change of the patch settings recomputes
TARGET, ELIGIBLE = 0.9, 0.5  # patched ≥ 0.9 × full wherever full ≥ 50%
NOT_ELIGIBLE = f"n/a (full < {ELIGIBLE:.0%})"
QUICK = {"models": ["tiny-llama"], "tasks": ["capitals"], "n_train": 4, "sizes": (1, 2),
         "select_grid": SELECT_GRID[:2], "select_answer_grid": ({"answer_tokens": 0}, {"answer_tokens": 2}),
         "select_fit": 3, "select_validate": 2}


def setting_name(s: dict) -> str:
    text = f"{s['kind']}, ridge {s['ridge']:g}, prefix {s['query_prefix']!r}"
    if s.get("answer_tokens"):
        text += f", answer tokens {s['answer_tokens']}"
    if s.get("iterations", 1) != 1 or s.get("eta", 1.0) != 1.0:
        text += f", η {s.get('eta', 1.0):g}, {s.get('iterations', 1)} sweeps"
    return text


def target_verdict(r: dict, patched: int) -> str:
    """The target's verdict for ``patched`` correct test answers against the row's full instruction."""
    if r["accuracy"]["full"] < ELIGIBLE:
        return NOT_ELIGIBLE
    return "met" if patched / r["correct"]["full"] >= TARGET else "missed"
