"""The check every public function runs on its ``model`` first: a bridge, with unprocessed weights.

icl_lens reads a TransformerLens ``TransformerBridge`` (TransformerLens 4 has no
``HookedTransformer``). A Hugging Face model, or anything else, gets one error that says to
wrap it with ``icl_lens.load_model(model, tokenizer)``.

Processed weights are refused. TransformerLens's weight processing
(``bridge.enable_compatibility_mode()``, ``bridge.process_weights()``) folds each norm's gain
``g`` (and bias) into the next dense weights, ``W' = W diag(g)``, centres the weights that
write to the residual stream and folds value biases. The model computes the same function,
and the identity ``(W' + ΔW') a' = W' A'`` still holds (Dherin et al. 2025, arXiv
2507.16003), but the ``W`` whose update is measured has changed: ``u = W δ`` stays the same
while the context-free input ``a' = N(r + attn_0)`` loses the gain, so the patch norm
``‖ΔW‖_F = ‖u‖ / ‖a‖`` is rescaled per layer and token by ``‖a‖ / ‖a'‖`` (per-layer sums on
the README's prompt, unprocessed / processed: 2.6–10.8 on SmolLM2-135M, 0.7–3.9 on Gemma 3
270M). Patch norms (docs/design.md §2) are defined on the weights as published.
``load_model(bridge, allow_processed=True)`` accepts a processed bridge with a
:class:`ProcessedWeightsWarning`; its norms then describe the processed parametrisation only
(not comparable with the unprocessed model, other models or published numbers).

TransformerBridge marks processing in its ``_weights_processed`` flag (TransformerLens 4.3),
which this check reads. Weights folded elsewhere and loaded into a fresh model cannot be told
apart from published ones.
"""
from __future__ import annotations

from icl_lens.model._per_model import model_cache


class NotABridgeError(TypeError):
    """``model`` is not a TransformerBridge (e.g. a Hugging Face model): wrap it with ``icl_lens.load_model``."""


class ProcessedWeightsError(ValueError):
    """The bridge's weights were processed (folded / centred norms, folded biases): patch norms would change."""


class ProcessedWeightsWarning(UserWarning):
    """A processed bridge was accepted with ``allow_processed=True``: its patch norms describe the folded weights."""


PROCESSED_MESSAGE = (
    "This TransformerBridge's weights were processed (enable_compatibility_mode() or process_weights(): "
    "norm gains folded into W_in, weights centred, biases folded). Token patches still reproduce the model, "
    "but patch norms are measured on the folded W_in and shrink or grow per layer, so icl_lens needs the "
    "unprocessed parametrisation: use a fresh bridge (icl_lens.load_model(name) or "
    "TransformerBridge.boot_transformers(...) without enable_compatibility_mode()), or "
    "icl_lens.load_model(bridge, allow_processed=True) to accept norms of the processed weights"
)


def is_processed(model) -> bool:
    """Whether TransformerLens processed ``model``'s weights (folded or centred norms, folded biases)."""
    return bool(getattr(model, "_weights_processed", False))


def allow_processed(model) -> None:
    """Accept ``model``'s processed weights from now on (``load_model(..., allow_processed=True)``)."""
    model_cache(model, "settings")["allow_processed"] = True


def check_model(model) -> None:
    """Raise :class:`NotABridgeError` or :class:`ProcessedWeightsError` where icl_lens cannot read ``model``."""
    if not hasattr(model, "cfg"):
        what = type(model).__name__
        hint = "model, tokenizer" if hasattr(model, "config") else "name_or_model"
        raise NotABridgeError(
            f"icl_lens needs a TransformerBridge (TransformerLens 4 has no HookedTransformer); got a {what}: "
            f"load it with model = icl_lens.load_model({hint})")
    if is_processed(model) and not model_cache(model, "settings").get("allow_processed"):
        raise ProcessedWeightsError(PROCESSED_MESSAGE)
