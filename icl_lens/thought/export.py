"""Export a thought patch as a plain Hugging Face model directory (arXiv 2510.08734).

The written directory loads with ``transformers.AutoModelForCausalLM.from_pretrained(dir)``
alone (no icl_lens import, no remote code) and computes what the hook-patched bridge
computes. Edits, per patched layer ``l`` (``Δ = W M``):

- every family: ``W_in ← W_in + W_in M`` (GPT-2 ``c_fc``; Llama/Gemma ``up_proj``) and
  ``W_gate ← W_gate + W_gate M`` (``gate_proj``);
- GPT-2 (``mlp`` output has a bias): ``c_proj.bias ← c_proj.bias + c``;
- Llama (no MLP bias): the config gets ``mlp_bias = True``; ``gate_proj`` and
  ``up_proj`` get zero biases, ``down_proj.bias = c`` (zero in unpatched layers). Exact:
  the MLP branch is added to the residual with no norm after it;
- Gemma 3 (post-FFN RMSNorm, no bias slot anywhere on the residual path: every write to
  the residual stream ends in an RMSNorm, so no constant offset is representable): the
  vector is fitted as a gain update, ``post_feedforward_layernorm.weight ← w + g``,
  which the hooks apply identically (:mod:`icl_lens.core.least_squares`);
- every family, kind ``"both+down"``: the down projection ``W_out ← W_out + uᵀ v``
  (GPT-2 ``c_proj``; Llama/Gemma ``down_proj``).

Weights are written in the model's dtype with the tokenizer beside them.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch

from icl_lens.model.block_family import block_family, first_dense_modules, original


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


def export_thought_model(model, maps: dict, vectors: dict, directory: str | Path, *, downs: dict | None = None) -> Path:
    """Write the patched model and its tokenizer to ``directory``; return the path.

    ``downs``: layer → ``(u, v)`` factors of ``ΔW_out = uᵀ v`` (optional).
    """
    family = block_family(model)
    hf = model.original_model
    config = copy.deepcopy(hf.config)
    if family.name == "llama" and any(v is not None for v in vectors.values()):
        config.mlp_bias = True
    with torch.device("meta"):
        fresh = type(hf)(config)
    canonical = set(fresh.state_dict().keys())
    sd, names = _clean_state(hf, canonical)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)

    def edit(key: str, new: torch.Tensor) -> None:
        sd[key] = new.to(sd[key].dtype).contiguous()

    for layer, m in maps.items():
        if m is None:
            continue
        for module in first_dense_modules(model, layer).values():
            key = _weight_name(names, module)
            w = sd[key].to(m.dtype)
            if family.name == "gpt2":  # Conv1D stores [d_in, d_out] = Wᵀ; (W M)ᵀ = Mᵀ Wᵀ
                edit(key, w + m.T @ w)
            else:
                edit(key, w + w @ m)

    for layer, (u, v) in (downs or {}).items():
        key = _weight_name(names, model.blocks[layer].mlp.out)
        w = sd[key].to(u.dtype)
        edit(key, w + (v.T @ u if family.name == "gpt2" else u.T @ v))  # Conv1D stores W_outᵀ

    for layer in range(model.cfg.n_layers):
        vec = vectors.get(layer)
        mlp = model.blocks[layer].mlp
        if family.name == "gpt2":
            if vec is not None:
                key = _weight_name(names, mlp.out)[: -len("weight")] + "bias"
                edit(key, sd[key].to(vec.dtype) + vec)
        elif family.name == "llama":
            if config.mlp_bias:
                d_mlp, d_model = model.cfg.d_mlp, model.cfg.d_model
                dtype = sd[_weight_name(names, mlp.out)].dtype
                for module, size in ((mlp.gate, d_mlp), (mlp.__getattr__("in"), d_mlp), (mlp.out, d_model)):
                    key = _weight_name(names, module)[: -len("weight")] + "bias"
                    sd[key] = torch.zeros(size, dtype=dtype)
                if vec is not None:
                    key = _weight_name(names, mlp.out)[: -len("weight")] + "bias"
                    sd[key] = vec.to(dtype).contiguous()
        elif vec is not None:  # gemma3: post-FFN norm gain
            key = _weight_name(names, model.blocks[layer].ln2_post)
            edit(key, sd[key].to(vec.dtype) + vec)

    missing = canonical - set(sd)
    if missing:
        raise RuntimeError(f"export could not find weights for {sorted(missing)[:5]}")
    fresh.load_state_dict(sd, strict=True, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        fresh.tie_weights()
    fresh.save_pretrained(directory)
    model.tokenizer.save_pretrained(directory)
    return directory
