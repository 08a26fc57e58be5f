"""Export a thought patch as a plain Hugging Face model directory (arXiv 2510.08734).

The written directory loads with ``transformers.AutoModelForCausalLM.from_pretrained(dir)``
alone (no icl_lens import, no remote code) and computes what the hook-patched bridge
computes. Edits, per patched layer ``l`` (``Δ = W M``):

- the matrix, every family: each stored first dense matrix ``W ← W + W M`` (GPT-2's
  ``Conv1D`` stores ``Wᵀ``: ``Wᵀ ← Wᵀ + Mᵀ Wᵀ``; a fused ``gate_up`` matrix is one ``W``);
- the vector, as the block family's ``vector_export`` says
  (:mod:`icl_lens.model._block_family`):

  - ``"mlp_out_bias"`` (GPT-2 ``c_proj``, GPT-NeoX ``dense_4h_to_h``): ``bias ← bias + c``;
  - ``"mlp_bias_config"`` (Llama): the config gets ``mlp_bias = True``; ``gate_proj`` and
    ``up_proj`` get zero biases, ``down_proj.bias = c`` (zero in unpatched layers). Exact:
    the MLP branch is added to the residual with no norm after it;
  - ``"post_norm_gain"`` (Gemma 2/3, OLMo-2: every write to the residual ends in an
    RMSNorm, so no constant offset is representable): the vector was fitted as a gain
    update, ``post_feedforward_layernorm.weight ← w + g``, which the hooks apply identically;
  - ``None`` (Mistral, Qwen2, Qwen3, Phi-3: no bias after the MLP, no norm after it, and
    no config switch for either): a patch with a vector part cannot be written into
    that class; export ``kind="matrix"`` patches, or apply the vector through hooks;
- the down-projection map, kind ``"both+down"``, every family: ``W_out ← W_out + uᵀ v``
  (GPT-2's ``Conv1D`` stores ``W_outᵀ``: ``+ vᵀ u``).

Weights are written in the model's dtype with the tokenizer beside them: ``save_pretrained``
writes the model's own weights, then each edited weight is computed and written over its
own in the file, one at a time (an export holds one edited weight, not all of them). For a
multimodal checkpoint (Gemma 3 4B–27B) the bridge runs its text tower, and that is
what is written: a ``Gemma3ForCausalLM`` directory without the vision tower.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from icl_lens.model._block_family import block_family, original, stored_dense_modules


class VectorNotExportableError(ValueError):
    """The model's Hugging Face class has no parameter that can hold the thought vector."""


def _canonical(name: str) -> str:
    """HF parameter name without the bridge's ``._original_component`` wrapper segments."""
    return name.replace("._original_component", "")


def _clean_state(hf, canonical: set[str]) -> tuple[dict[str, torch.Tensor], dict[int, str]]:
    """The HF state dict under its own key names (the bridge adds aliases), and param id → key."""
    sd: dict[str, torch.Tensor] = {}
    names: dict[int, str] = {}
    for name, t in hf.state_dict(keep_vars=True).items():
        key = _canonical(name)
        if key in canonical:
            sd.setdefault(key, t.detach().contiguous())
            names.setdefault(id(t), key)
    return sd, names


def _weight_name(names: dict[int, str], module) -> str:
    return names[id(original(module).weight)]


def _bias_name(names: dict[int, str], module) -> str:
    return _weight_name(names, module)[: -len("weight")] + "bias"


def _plus_map(m: torch.Tensor, conv1d: bool):
    """``W ← W + W M`` (GPT-2's ``Conv1D`` stores ``[d_in, d_out] = Wᵀ``: ``(W M)ᵀ = Mᵀ Wᵀ``)."""
    def change(w: torch.Tensor) -> torch.Tensor:
        w = w.to(m.dtype)
        return w + (m.T @ w if conv1d else w @ m)
    return change


def _edited(weight: torch.Tensor, changes: list):
    """The edited weight, computed when called (in the stored dtype)."""
    def make() -> torch.Tensor:
        w = weight
        for change in changes:
            w = change(w)
        return w.to(weight.dtype).contiguous()
    return make


_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def write_edited(directory: Path, edits: dict) -> None:
    """Overwrite tensors in place in the safetensors files ``save_pretrained`` wrote to ``directory`` (one or several
    shards), one at a time: ``edits`` maps a key to a function returning its new value (same shape and dtype as
    written), so only one edited weight is in memory at once (an export of every layer's weights would otherwise hold
    them all). Each file's header says which keys it holds."""
    found: set[str] = set()
    for path in sorted(directory.glob("*.safetensors")):
        with open(path, "r+b") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
            for key in [k for k in edits if k in header]:
                new = edits[key]()
                begin, end = header[key]["data_offsets"]
                if (header[key]["shape"] != list(new.shape) or end - begin != new.numel() * new.element_size()
                        or header[key]["dtype"] != _SAFETENSORS_DTYPES.get(new.dtype)):
                    raise RuntimeError(f"export: the edited {key} ({new.dtype}, {list(new.shape)}) does not match "
                                       f"the written one ({header[key]['dtype']}, {header[key]['shape']})")
                f.seek(8 + size + begin)
                f.write(new.reshape(-1).view(torch.uint8).numpy())
                found.add(key)
                del new  # freed before the next edit is computed
    if set(edits) - found:
        raise RuntimeError(f"export: {sorted(set(edits) - found)[:5]} are not in the written weights")


def export_thought_model(model, maps: dict, vectors: dict, directory: str | Path, *, downs: dict | None = None) -> Path:
    """Write the patched model and its tokenizer to ``directory``; return the path.

    ``downs``: layer → ``(u, v)`` factors of ``ΔW_out = uᵀ v`` (optional).
    """
    family = block_family(model)
    hf = model.original_model
    has_vector = any(v is not None for v in vectors.values())
    if has_vector and family.vector_export is None:
        raise VectorNotExportableError(
            f"{type(hf).__name__} ({family.name} family) has no parameter that adds a constant after the MLP "
            f"branch, so this thought patch's vector cannot be written into it. Export a kind='matrix' patch, "
            f"or apply this one with `with patch.applied(model): ...`."
        )
    config = copy.deepcopy(hf.config)
    if family.vector_export == "mlp_bias_config" and has_vector:
        config.mlp_bias = True
    with torch.device("meta"):
        fresh = type(hf)(config)
    canonical = set(fresh.state_dict().keys())
    sd, names = _clean_state(hf, canonical)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)

    edits: dict[str, list] = {}  # key → functions of the weight, applied in order as the weight is written

    def edit(key: str, change) -> None:
        edits.setdefault(key, []).append(change)

    for layer, m in maps.items():
        if m is None:
            continue
        for module in stored_dense_modules(model, layer):
            edit(_weight_name(names, module), _plus_map(m, conv1d=type(module).__name__ == "Conv1D"))

    for layer, (u, v) in (downs or {}).items():
        out = model.blocks[layer].mlp.out
        conv1d = type(original(out)).__name__ == "Conv1D"  # stores W_outᵀ
        edit(_weight_name(names, out), lambda w, u=u, v=v, t=conv1d: w.to(u.dtype) + (v.T @ u if t else u.T @ v))

    for layer in range(model.cfg.n_layers):
        vec = vectors.get(layer)
        mlp = model.blocks[layer].mlp
        if family.vector_export == "mlp_out_bias" and vec is not None:
            edit(_bias_name(names, mlp.out), lambda b, c=vec: b.to(c.dtype) + c)
        elif family.vector_export == "mlp_bias_config" and config.mlp_bias:
            d_mlp, d_model = model.cfg.d_mlp, model.cfg.d_model
            dtype = sd[_weight_name(names, mlp.out)].dtype
            for module, size in ((mlp.gate, d_mlp), (mlp.__getattr__("in"), d_mlp), (mlp.out, d_model)):
                sd[_bias_name(names, module)] = torch.zeros(size, dtype=dtype)
            if vec is not None:
                sd[_bias_name(names, mlp.out)] = vec.to(dtype).contiguous()
        elif family.vector_export == "post_norm_gain" and vec is not None:
            edit(_weight_name(names, model.blocks[layer].ln2_post), lambda g, c=vec: g.to(c.dtype) + c)

    missing = canonical - set(sd)
    if missing:
        raise RuntimeError(f"export could not find weights for {sorted(missing)[:5]}")
    fresh.load_state_dict(sd, strict=True, assign=True)  # the model's own weights: views, no copy
    if getattr(config, "tie_word_embeddings", False):
        fresh.tie_weights()
    fresh.save_pretrained(directory)
    write_edited(directory, {key: _edited(sd[key], changes) for key, changes in edits.items()})
    model.tokenizer.save_pretrained(directory)
    return directory
