"""The thought-patch fit's kinds, its settings object :class:`ThoughtFit` and the documented defaults
(Algorithm 1 of Mazzawi, Dherin et al. 2025, arXiv 2510.08734), without importing torch: the command
line builds its ``thought-eval`` options from them before anything heavy is imported.
"""
from __future__ import annotations

import hashlib
import json
import math
import operator
from dataclasses import asdict, dataclass
from pathlib import Path

from icl_lens._settings import Settings

#: evaluate_thought's conditions: the query alone, the full prompt, then the query alone under each edit.
CONDITIONS = ("none", "full", "patched", "distilled", "steering", "control")
EDITS = ("patched", "distilled", "steering", "control")  # conditions that edit the model: locality is measured for these

#: What each ``kind`` fits: the paper's parts (``matrix``, ``vector``) and the down-projection map.
KIND_PARTS = {
    "vector": ("vector",),
    "matrix": ("matrix",),
    "both": ("matrix", "vector"),
    "both+down": ("matrix", "vector", "down"),
}
KINDS = tuple(KIND_PARTS)
# The documented default (reports/eval_thought.md: chosen on the shipped tasks' train
# queries of both embedded models, the same for every task and model; kind, ridge and
# prefix by KL at the last query token, then the answer tokens by KL at the answer's positions).
DEFAULT_KIND = "both+down"
DEFAULT_RIDGE = 8.0
DEFAULT_QUERY_PREFIX = "\n"
DEFAULT_ANSWER_TOKENS = 8
# The locality term's strength (thought_patch(preserve_strength=...)): the preserved keys' covariance weighs
# preserve_strength × the calibration rows' in every fit. Chosen by experiments/thought/settings.py's rule
# (choose_strength over PRESERVE_STRENGTHS, PRESERVE_SLACK) on held-out train queries and held-out preserve texts,
# both embedded models × the four selection tasks (reports/eval_thought.md, "Preserve strength"). The texts are
# icl_lens.thought._preserve.preserve_texts(model): the model's own samples from BOS and the shipped few-shot prompts
# (thought_patch's preserve=None).
DEFAULT_PRESERVE_STRENGTH = 10.0
# What the shipped preserve texts hold (icl_lens.thought.preserve_texts; results name it. Before issue 22's few-shot
# prompts: the model's samples alone).
PRESERVE_SET = "samples+few-shot"
FIT_FILE = "icl_lens_thought.json"  # beside a thought patch's Hugging Face export: its fit, read by ThoughtFit.load
# Context distillation (icl_lens.thought._distill): Adam steps, peak learning rate, queries per step, warm-up share
# (linear warm-up, then cosine decay to 0). The rate is experiments/thought/settings.py's choose_lr over DISTILL_LRS
# on held-out train queries of both embedded models (reports/eval_thought.md, "Distillation's learning rate"); the
# earlier 1e-3 had not been selected by any rule.
DISTILL_STEPS, DISTILL_LR, DISTILL_BATCH, DISTILL_WARMUP = 100, 3e-05, 8, 0.1


def _positive_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _finite(name: str, value, *, positive: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ThoughtFit(Settings):
    """The settings of one thought-patch fit (Algorithm 1 of arXiv 2510.08734; :func:`icl_lens.thought_patch`).

    ``ThoughtFit()`` is the documented default, chosen on held-out train queries of both embedded models
    (reports/eval_thought.md). A fit's settings travel with what it makes: every :class:`ThoughtPatch`
    holds its ``fit``, its Hugging Face export writes it beside the weights (:meth:`load` reads it
    back), and ``python -m experiments.thought`` hashes it into every cache key (:meth:`key`), so a
    changed default is never read as an old result.

    ``kind``: ``"vector"``, ``"matrix"``, ``"both"`` (the paper's thought matrix and vector) or
    ``"both+down"`` (plus the down-projection fit of what the vector leaves). ``eta``: step size.
    ``ridge``: scale-free, ``≥ 0`` (0: minimum-norm pseudo-inverse). ``layers``: the layers patched
    (``None``: all). ``iterations``: sweeps over the layers. ``query_prefix``: text between BOS and
    the query in the query-only pass (the patched model is prompted the same way).
    ``answer_tokens``: also fit at the first tokens of the model's own greedy answer under the
    instruction. ``preserve``: texts whose keys the fit must keep (MEMIT-style penalty weighted by
    ``preserve_strength``, 0: off); ``None``: the model's shipped preserve texts
    (:func:`~icl_lens.thought.preserve_texts`, set :data:`PRESERVE_SET`), ``()``: none (the paper's
    fit). ``batch_size``: sequences per forward.
    """

    kind: str = DEFAULT_KIND
    eta: float = 1.0
    ridge: float = DEFAULT_RIDGE
    layers: tuple[int, ...] | None = None
    iterations: int = 1
    query_prefix: str = DEFAULT_QUERY_PREFIX
    answer_tokens: int = DEFAULT_ANSWER_TOKENS
    preserve: tuple[str, ...] | None = None
    preserve_strength: float = DEFAULT_PRESERVE_STRENGTH
    batch_size: int = 16
    null_space: float | None = None
    _what = "thought-fit setting"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen: normalise once)
        set_("eta", _finite("eta", self.eta, positive=True))
        set_("ridge", _finite("ridge", self.ridge))
        set_("preserve_strength", _finite("preserve_strength", self.preserve_strength))
        _positive_int("iterations", self.iterations, 1)
        _positive_int("answer_tokens", self.answer_tokens, 0)
        _positive_int("batch_size", self.batch_size, 1)
        if self.null_space is not None:
            eps = _finite("null_space", self.null_space)
            if eps >= 1:
                raise ValueError(f"null_space must be None or a share of the trace in [0, 1), got {self.null_space!r}")
            set_("null_space", eps)
        if not isinstance(self.query_prefix, str) or isinstance(self.preserve, str):
            from icl_lens.model._prompts import PromptError

            what = "query prefix must be a string" if not isinstance(self.query_prefix, str) else \
                "preserve must be a list of strings, not one string"
            raise PromptError(what)
        if self.layers is not None:
            try:
                set_("layers", tuple(sorted({operator.index(l) for l in self.layers})))
            except TypeError:
                raise ValueError(f"layers must be a list of layer indices or None, got {self.layers!r}") from None
        if self.preserve is not None:
            set_("preserve", tuple(self.preserve))

    @property
    def reads_preserve(self) -> bool:
        """Whether the fit reads the preserve texts (the penalty or the null-space projection)."""
        return bool(self.preserve_strength) or self.null_space is not None

    def to_dict(self) -> dict:
        """Plain JSON types: lists for ``layers`` and ``preserve``."""
        d = asdict(self)
        d["layers"] = None if self.layers is None else list(self.layers)
        d["preserve"] = None if self.preserve is None else list(self.preserve)
        return d

    def key(self, preserve_set: str = PRESERVE_SET) -> str:
        """A short stable hash of everything the fit depends on: the settings, and for ``preserve=None``
        the shipped preserve set it reads (texts are unused at ``preserve_strength`` 0 without ``null_space``).
        ``null_space=None`` is left out, so a fit without the projection keeps the key it had before the field."""
        d = self.to_dict()
        if d["null_space"] is None:
            del d["null_space"]
        if not self.reads_preserve:
            d["preserve"] = []
        elif self.preserve is None:
            d["preserve"] = f"shipped: {preserve_set}"
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]

    @classmethod
    def load(cls, directory) -> "ThoughtFit":
        """The fit of a thought patch exported with :meth:`ThoughtPatch.save_pretrained`."""
        data = json.loads((Path(directory) / FIT_FILE).read_text(encoding="utf-8"))
        return cls.from_dict(data["fit"])
