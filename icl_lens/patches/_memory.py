"""Memory: what computing a prompt's token patches needs, and what the process may use.

:func:`estimate_patches_memory` sizes the work of one prompt of ``n`` tokens from the model's
shape (docs/design.md §2): the factors grow as ``layers · n · (d_mlp + 2 d_model)``, the
forward's activations as ``layers · n · d_model`` plus ``heads · n²`` attention scores, the
equivalence check of ``icl-lens patches`` as ``min(n, 128) · vocabulary``. ``icl-lens patches``
refuses a prompt whose estimate exceeds :func:`available_memory`; ``icl-lens sweep`` turns
such a row into a bad row (:mod:`icl_lens.sweep`).

:func:`available_memory` is the smallest of what the host has free (``MemAvailable``), what the
process's cgroup still allows (v2 ``memory.max − memory.current``, v1
``memory.limit_in_bytes − memory.usage_in_bytes``, of the cgroup and every cgroup above it:
Docker, Slurm, Binder and systemd set their caps there, and the kernel kills a process that
crosses them without a message) and a limit the user gives; on a CUDA device, the device's
free memory (and the user's limit).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")  # where cgroup file systems are mounted (a folder of files in tests)
PROC_CGROUP = Path("/proc/self/cgroup")
EQUIVALENCE_CHUNK = 128  # verify_equivalence's default chunk_size
QUERY_CHUNK = 512  # token_patches' default query_chunk (icl_lens.patches._batches reads it from here)


def format_bytes(n: float) -> str:
    """``1.5 GB``, ``12 MB``, ``300 B`` (powers of 1000)."""
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes the work on one prompt holds beyond the loaded model, by part (an estimate).

    ``weights``: each layer's dense MLP weights materialised in the patch dtype (plus a float32
    copy of the model for the half-precision noise floor); ``factors``: the token patches,
    ``layers · tokens · (d_mlp per dense input + 2 d_model)``; ``activations``: the forward's
    per-layer activations and its float64 attention scores; ``equivalence``: full-vocabulary
    logits of the positions the equivalence check compares at once (and the noise floor).
    """

    tokens: int
    weights: int
    factors: int
    activations: int
    equivalence: int

    @property
    def total(self) -> int:
        return self.weights + self.factors + self.activations + self.equivalence

    def describe(self) -> str:
        return (f"about {format_bytes(self.total)} for {self.tokens} tokens (factors {format_bytes(self.factors)}, "
                f"activations {format_bytes(self.activations)}, equivalence check {format_bytes(self.equivalence)}, "
                f"weights {format_bytes(self.weights)})")

    def to_frame(self):
        import pandas as pd

        parts = ("weights", "factors", "activations", "equivalence")
        return pd.DataFrame({"part": [*parts, "total"], "bytes": [*(getattr(self, p) for p in parts), self.total]})


def estimate_patches_memory(model, n_tokens: int, *, noise_floor: bool = False,
                            equivalence: bool = True, query_chunk: int | None = QUERY_CHUNK) -> MemoryEstimate:
    """What the token patches of an ``n_tokens`` prompt on ``model`` (a loaded bridge) need.

    It errs high: the peak RSS of token patches and the equivalence check on SmolLM2-135M (30 layers, 49k
    vocabulary) measured 0.65 of it at 1,091 tokens and 0.86 at 2,491 (tests/test_cli.py repeats such a run at
    about 300 tokens and asserts a factor of 2 either way); it grows as
    ``tokens · layers · (d_mlp + d_model)`` for the factors and activations, ``min(tokens, 128) ·
    vocabulary`` for the (chunked) equivalence check and ``heads · min(tokens, query_chunk) · tokens`` for
    attention.
    ``noise_floor``: a float32 copy of the model and its logits too (half precision);
    ``equivalence=False``: no equivalence check (a sweep runs none). ``query_chunk``: the queries per forward
    (:func:`icl_lens.token_patches`' default for one prompt: scores of ``heads · min(tokens, query_chunk) · tokens``;
    None: one forward, ``heads · tokens²``, as a batch of several prompts runs).
    """
    from icl_lens.model._block_family import block_family
    from icl_lens.model._types import patch_dtype

    cfg, n = model.cfg, int(n_tokens)
    patch = patch_dtype(model).itemsize
    logit = max(cfg.dtype.itemsize, 4)
    dense = 2 if block_family(model).gated else 1
    L, D, F, H, V = cfg.n_layers, cfg.d_model, cfg.d_mlp, cfg.n_heads, cfg.d_vocab
    weights = L * (dense + 1) * F * D * patch
    factors = L * n * (dense * F + 2 * D) * patch
    rows = n if query_chunk is None else min(n, query_chunk)
    activations = 4 * L * n * D * patch + 3 * H * rows * n * 8  # scores, float64 softmax, mask
    chunk = min(n, EQUIVALENCE_CHUNK)  # verify_equivalence unembeds and compares this many positions at a time
    check = 4 * chunk * V * logit if equivalence else 0  # contextual logits, kept-only rows, their stack, the diff
    if noise_floor:
        weights += 4 * sum(p.numel() for p in model.parameters())
        check += 4 * chunk * V * 4
    return MemoryEstimate(tokens=n, weights=weights, factors=factors, activations=activations, equivalence=check)


def _read_int(path: Path) -> int | None:
    """An integer file of a cgroup (``max`` and absurd v1 'no limit' values are None)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) >= 1 << 60:
        return None
    return int(text)


def _cgroup_paths(proc_cgroup: Path) -> tuple[str | None, str | None]:
    """This process's cgroup v2 path and v1 memory-controller path, as /proc/self/cgroup names them."""
    v2 = v1 = None
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _chain(mount: Path, path: str | None) -> list[Path]:
    """The cgroup's folder and every folder above it up to the mount; inside a container, where the host path
    of /proc/self/cgroup is not mounted, the mount itself (the container's own cgroup)."""
    if not mount.is_dir():
        return []
    rel = Path((path or "/").lstrip("/"))
    own = mount / rel
    if not own.is_dir():
        return [mount]
    return [own, *[mount / p for p in rel.parents if (mount / p).is_dir()]]


def cgroup_memory_available(root: str | Path | None = None, proc_cgroup: str | Path | None = None) -> int | None:
    """Bytes this process's cgroup (and every cgroup above it) still allows; None where no limit is set.

    ``root``: where the cgroup file systems are mounted (default :data:`CGROUP_ROOT`); ``proc_cgroup``: the
    file naming the process's cgroups (default :data:`PROC_CGROUP`)."""
    root, proc_cgroup = Path(root or CGROUP_ROOT), Path(proc_cgroup or PROC_CGROUP)
    v2, v1 = _cgroup_paths(proc_cgroup)
    left = []
    candidates = []
    if v2 is not None:
        candidates.append((root if (root / "cgroup.controllers").exists() else root / "unified", v2,
                           "memory.max", "memory.current"))
    if v1 is not None:
        candidates.append((root / "memory", v1, "memory.limit_in_bytes", "memory.usage_in_bytes"))
    for mount, path, limit_name, usage_name in candidates:
        for folder in _chain(mount, path):
            limit = _read_int(folder / limit_name)
            if limit is not None:
                left.append(max(0, limit - (_read_int(folder / usage_name) or 0)))
    return min(left) if left else None


def memory_limits(device=None, limit: int | None = None, *, cgroup_root: str | Path | None = None) -> dict[str, int]:
    """Each bound on the memory the work may use, by name: ``available RAM`` and ``cgroup limit`` (on the CPU) or
    ``free CUDA memory``, and ``--max-memory`` (``limit``, when given)."""
    bounds = {}
    if device is not None and getattr(device, "type", str(device).split(":")[0]) == "cuda":
        import torch

        bounds["free CUDA memory"] = int(torch.cuda.mem_get_info(device)[0])
    else:
        import psutil

        bounds["available RAM"] = int(psutil.virtual_memory().available)
        room = cgroup_memory_available(cgroup_root)
        if room is not None:
            bounds["cgroup limit"] = room
    if limit is not None:
        bounds["--max-memory"] = int(limit)
    return bounds


def available_memory(device=None, limit: int | None = None, *, cgroup_root: str | Path | None = None) -> int:
    """Bytes the work may use: the smallest of :func:`memory_limits` (the host's available RAM, the cgroup's room
    and ``limit``; on a CUDA device, its free memory and ``limit``)."""
    return min(memory_limits(device, limit, cgroup_root=cgroup_root).values())
