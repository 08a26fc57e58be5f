"""Write token-patch factors to safetensors for analysis outside Python sessions.

Tensors: ``u_in`` [layers, positions, d_mlp] (W_in, or W_up for gated MLPs), ``u_gate``
(gated MLPs only), ``v`` [layers, positions, d_model], ``correction`` [layers, positions,
d_model], ``tokens`` [positions] (token ids). ``ΔW[l,t] = u[l,t] v[l,t]ᵀ``.
"""
from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from icl_lens.core.patch_set import TokenPatches


def save_patches(patches: TokenPatches, path: str | Path) -> Path:
    tensors = {
        "u_in": patches.u_in, "v": patches.v, "correction": patches.correction, "tokens": patches.token_ids,
    }
    if patches.u_gate is not None:
        tensors["u_gate"] = patches.u_gate
    tensors = {k: t.detach().cpu().contiguous() for k, t in tensors.items()}
    metadata = {"model": patches.model_name, "kept_bos": str(patches.kept_bos),
                "token_strings": json.dumps(list(patches.tokens))}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)
    return path
