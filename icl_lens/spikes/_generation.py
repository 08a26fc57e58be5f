"""Generate text while recording every new token's patch norms, spike score and flag.

For each generated token ``g_k`` at position ``t = P + k`` (``P`` = prompt length) the
record holds (docs/design.md §2; Dherin et al. 2025, arXiv 2507.16003):

* its token patch norms ``‖ΔW[l, t]‖_F`` for every layer ``l`` (the patch of ``g_k`` read
  as the query, with its context {prompt, g_0..g_{k-1}} removed),
* its spike score and flag (:func:`icl_lens.spike_scores` over the whole sequence; the
  score is causal, so it equals the score computed online at step ``k``); by default the
  flag threshold is the model's calibrated one (:mod:`icl_lens.spikes._thresholds`:
  at most 5% of the answer tokens of correct answers flagged), 3.5 for models, statistics
  or windows without a calibration,
* ``answer_flag``: where the model has a shipped wrong-answer detector
  (:mod:`icl_lens.spikes._detector`: the candidate, patch-based or not, that ranked wrong
  answers best on kinds of question it never saw), its reading of the answer (the generated
  tokens before the first newline): ``p_wrong``, ``flagged``, the detector's one-line
  description (what the flag is computed from and what token patches add), and the
  baselines' values for this answer (−log p, entropy, length; sampling disagreement when
  samples were drawn). A detector that reads the hidden state has the probe layer's residual
  recorded during generation; one that reads sampling agreement gets ``answer_samples``
  answers sampled at temperature 1 after the prompt (one batch, seeded from the prompt's
  text). It was measured on short factual answers asked in the detector's ``question_format``;
  for other prompts it is an extrapolation,
* ``logprob_k = log p(g_k | prefix)`` and the predictive entropy
  ``H_k = −Σ_v p(v | prefix) log p(v | prefix)`` (nats) of the distribution ``g_k`` was
  drawn from, both under the model's own distribution (temperature 1, whatever the
  sampling temperature).

The key/value cache is reused across steps through :class:`PatchSession`, which
recomputes only the positions after the longest common prefix with its previous call,
so a step costs one query position, not a forward over the whole sequence. Passing the
same ``session`` to several calls also reuses a shared prompt prefix (few-shot preamble).
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from icl_lens.model._prompts import PromptError, context_limit, encode_prompt, str_tokens
from icl_lens.model._residual_stream import recording_residual
from icl_lens.patches._incremental import PatchSession
from icl_lens.patches._patch_set import TokenPatches
from icl_lens.spikes._detector import (
    PROMPT_TAIL,
    AnswerFlag,
    AnswerReading,
    answer_length,
    probe_layer,
    read_answer,
    spike_detector,
)
from icl_lens.spikes._sampling import prompt_state, sample_continuations, sample_seed
from icl_lens.spikes._scores import SpikeFlags, spike_scores
from icl_lens.spikes._settings import SpikeSettings
from icl_lens.spikes._thresholds import SpikeThreshold, spike_threshold

if TYPE_CHECKING:
    from icl_lens.model._types import Model


CALIBRATED = SpikeSettings(threshold=None)  # generation's default: the model's calibrated threshold

@dataclass(frozen=True, eq=False)
class GenerationPatches:
    """A generation with, per generated token, patch norms, spike score/flag, log-prob and entropy.

    ``recomputed``: positions computed by each session update (the prompt's first, then
    one per generated token); 1 per step shows the key/value cache was reused.
    ``threshold``: the flag threshold used and whether it was calibrated for this model
    (``spikes.threshold`` holds the same number).
    """

    model_name: str
    prompt_length: int
    token_ids: Int[Tensor, " pos"]
    tokens: tuple[str, ...]
    patches: TokenPatches
    spikes: SpikeFlags
    logprobs: Float[Tensor, " new"]
    entropies: Float[Tensor, " new"]
    greedy: bool
    temperature: float
    seed: int | None
    stop_reason: str
    recomputed: tuple[int, ...] = ()
    threshold: SpikeThreshold | None = None
    answer_flag: AnswerFlag | None = None

    @property
    def n_new(self) -> int:
        return int(self.logprobs.shape[0])

    @property
    def positions(self) -> list[int]:
        """Positions of the generated tokens in the full sequence."""
        return list(range(self.prompt_length, self.prompt_length + self.n_new))

    @property
    def generated_ids(self) -> Int[Tensor, " new"]:
        return self.token_ids[self.prompt_length:]

    @property
    def generated_tokens(self) -> tuple[str, ...]:
        return self.tokens[self.prompt_length:]

    @property
    def text(self) -> str:
        """The generated continuation as text."""
        return "".join(self.generated_tokens)

    @property
    def norms(self) -> Float[Tensor, "layer new"]:
        """Patch norm of each generated token in every layer."""
        return self.spikes.norms[:, self.prompt_length:]

    @property
    def scores(self) -> Float[Tensor, " new"]:
        return self.spikes.scores[self.prompt_length:]

    @property
    def flags(self) -> Bool[Tensor, " new"]:
        return self.spikes.flags[self.prompt_length:]

    @property
    def enough_context(self) -> Bool[Tensor, " new"]:
        return self.spikes.enough_context[self.prompt_length:]

    def to_frame(self) -> pd.DataFrame:
        """One row per generated token: step, position, token, token_id, logprob, entropy,
        norm (Frobenius norm of the patch over all layers), score, flagged, enough_context."""
        total = torch.linalg.vector_norm(self.norms, dim=0).tolist()
        lp, ent = self.logprobs.tolist(), self.entropies.tolist()
        sc, fl, ok = self.scores.tolist(), self.flags.tolist(), self.enough_context.tolist()
        ids = self.generated_ids.tolist()
        rows = [
            {"step": k, "position": self.prompt_length + k, "token": self.generated_tokens[k], "token_id": ids[k],
             "logprob": lp[k], "entropy": ent[k], "norm": total[k], "score": sc[k], "flagged": bool(fl[k]),
             "enough_context": bool(ok[k])}
            for k in range(self.n_new)
        ]
        cols = ["step", "position", "token", "token_id", "logprob", "entropy", "norm", "score", "flagged",
                "enough_context"]
        return pd.DataFrame(rows, columns=cols)


def predictive_stats(logits: Float[Tensor, " vocab"]) -> tuple[Float[Tensor, " vocab"], float]:
    """Log-probabilities (float64) and entropy in nats of the softmax of ``logits``."""
    logp = torch.log_softmax(logits.detach().to(torch.float64), dim=-1)
    entropy = float(-(logp.exp() * logp).sum())
    return logp, entropy


def _validate(max_new_tokens: int, greedy: bool, temperature: float) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not greedy and (not isinstance(temperature, (int, float)) or not 0 < temperature < float("inf")):
        raise ValueError(f"sampling needs a finite temperature > 0, got {temperature!r} (or use greedy=True)")


def _next_token(logits: Tensor, greedy: bool, temperature: float, generator: torch.Generator | None) -> int:
    if greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.detach().to(torch.float64) / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _recomputed(session, ids: Tensor) -> int:
    """Positions the session's last update computed (all of them if it keeps no statistics)."""
    stats = getattr(session, "last_stats", None)
    return int(ids.numel()) if stats is None else int(stats.recomputed)


def _last_logits(session, vocab: int) -> Tensor:
    logits = session.last_logits
    if logits is None:
        raise RuntimeError("the patch session produced no logits")
    return logits.detach().reshape(-1, logits.shape[-1])[-1][:vocab]


def generate_with_patches(
    model: Model,
    prompt: str | Sequence[int] | Int[Tensor, " pos"],
    *,
    max_new_tokens: int = 32,
    greedy: bool = True,
    temperature: float = 1.0,
    seed: int | None = None,
    spikes: SpikeSettings | None = None,
    stop: Sequence[str] = (),
    stop_at_eos: bool = True,
    session: PatchSession | None = None,
    detector: bool = True,
    answer_samples: int | None = None,
    **spike_settings,
) -> GenerationPatches:
    """Generate up to ``max_new_tokens`` tokens and record each one's patches (module docstring).

    ``greedy``: argmax decoding, else sampling from ``softmax(logits / temperature)`` with
    a ``torch.Generator`` seeded by ``seed``. Generation stops early after an EOS token
    (``stop_at_eos``) or once the generated text contains one of the strings in ``stop``
    (the stopping token is kept). ``spikes``: the flags' :class:`~icl_lens.spikes.SpikeSettings`, default
    ``SpikeSettings(threshold=None)``: the model's calibrated threshold for the statistic and window over all
    layers (:func:`icl_lens.spike_threshold`), or 3.5 where there is none; ``spike_settings``: its fields as
    keyword arguments (``window``, ``threshold``, ``layers``, ``statistic``). ``session``: a
    :class:`PatchSession` of this model to reuse (its cached prefix is reused where the new
    prompt shares it). ``detector``: read the answer with the model's shipped wrong-answer
    detector where there is one (``answer_flag``; module docstring). ``answer_samples``:
    answers to sample for the sampling-agreement reading (default: as many as the detector
    reads, 0 for a detector that does not; the command line asks for them to print the baseline).
    """
    _validate(max_new_tokens, greedy, temperature)
    settings = SpikeSettings.of(spikes or CALIBRATED, **spike_settings)
    ids = encode_prompt(model, prompt)
    limit = context_limit(model)
    if ids.numel() + max_new_tokens > limit:
        raise PromptError(
            f"The prompt has {ids.numel()} tokens; with max_new_tokens={max_new_tokens} the sequence would "
            f"exceed the model's context length of {limit}. Shorten the prompt or generate fewer tokens."
        )
    if isinstance(stop, str):
        stop = (stop,)
    if session is not None and getattr(session, "model", model) is not model:
        raise ValueError("session belongs to another model; pass a PatchSession(model) of this model")
    session = PatchSession(model) if session is None else session
    generator = None
    if seed is not None:
        generator = torch.Generator(device=ids.device).manual_seed(int(seed))
    vocab = int(model.cfg.d_vocab)
    eos = getattr(model.tokenizer, "eos_token_id", None) if stop_at_eos else None
    prompt_length = int(ids.numel())
    logprobs: list[float] = []
    entropies: list[float] = []
    stop_reason = "max_new_tokens"
    recomputed: list[int] = []
    name = model.cfg.model_name
    found = spike_detector(name) if detector else None
    record = (recording_residual(model, probe_layer(int(model.cfg.n_layers))) if found is not None and found.needs_hidden
              else nullcontext(None))
    with torch.no_grad(), record as residual:
        patches = session.update(ids)
        recomputed.append(_recomputed(session, ids))
        for _ in range(max_new_tokens):
            logits = _last_logits(session, vocab)
            logp, entropy = predictive_stats(logits)
            token = _next_token(logits, greedy, temperature, generator)
            logprobs.append(float(logp[token]))
            entropies.append(entropy)
            ids = torch.cat([ids, torch.tensor([token], dtype=ids.dtype, device=ids.device)])
            patches = session.update(ids)
            recomputed.append(_recomputed(session, ids))
            if eos is not None and token == eos:
                stop_reason = "eos"
                break
            if stop and any(s in model.tokenizer.decode(ids[prompt_length:].tolist()) for s in stop):
                stop_reason = "stop"
                break
    chosen = None
    if settings.threshold is None:
        chosen = spike_threshold(name, settings)
        settings = settings.replace(threshold=chosen.value)
    flags = spike_scores(patches, settings)
    answer_flag = None
    if found is not None and prompt_length >= PROMPT_TAIL and len(logprobs) > 0:
        generated = str_tokens(model, ids)[prompt_length:]
        k = answer_length(generated)
        hidden = None
        if residual is not None:  # rows cover the last sum(recomputed) positions; keep P - 1 … P + k - 1
            rows = residual.rows().double().numpy()
            hidden = rows[rows.shape[0] - (ids.numel() - prompt_length + 1):][:k + 1]
        n_samples = (found.samples if found.needs_samples else 0) if answer_samples is None else int(answer_samples)
        drawn: tuple[str, ...] = ()
        if n_samples > 0:
            prompt_ids = ids[:prompt_length]
            rows = sample_continuations(
                model, prompt_state(model, prompt_ids, session=session), n=n_samples, temperature=1.0,
                max_new_tokens=found.max_new_tokens, stop="\n",
                generator=torch.Generator().manual_seed(sample_seed(model.tokenizer.decode(prompt_ids.tolist(),
                                                                          skip_special_tokens=True))))
            drawn = tuple("".join(str_tokens(model, torch.tensor(r, dtype=ids.dtype))) for r in rows)
        reading = AnswerReading(patches.norms().double().cpu().numpy(), patches.correction_norms().double().cpu().numpy(),
                                flags.informative.numpy(), prompt_length, k, np.array(logprobs), np.array(entropies),
                                hidden, drawn, "".join(generated))
        answer_flag = read_answer(found, reading, generated)
    return GenerationPatches(
        model_name=name,
        prompt_length=prompt_length,
        token_ids=ids.cpu(),
        tokens=str_tokens(model, ids),
        patches=patches,
        spikes=flags,
        logprobs=torch.tensor(logprobs, dtype=torch.float64),
        entropies=torch.tensor(entropies, dtype=torch.float64),
        greedy=greedy,
        temperature=float(temperature),
        seed=seed,
        stop_reason=stop_reason,
        recomputed=tuple(recomputed),
        threshold=chosen,
        answer_flag=answer_flag,
    )
