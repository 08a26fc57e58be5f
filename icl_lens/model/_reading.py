"""The one way icl_lens reads a model's activations: hooks inside a block, and a forward stopped early.

Writing has one door, :func:`icl_lens.model._weight_edits.edits_applied`; this is the door
beside it for reading. Every quantity of docs/design.md is read from hook points of the
forward: the residual ``r``, values and scores, the attention output ``attn_C`` and the
MLP input ``A = ln2(r + attn_C)`` of the token patches (Dherin et al. 2025, arXiv
2507.16003), the block outputs of thought patches (arXiv 2510.08734), attention
patterns. A read that needs only layers ``≤ l`` stops the forward right after the last
hook point it needs, so no later layer and no unembedding run:

    with activations_captured(model, [name], stop_after=name) as acts:
        model(ids, return_type=None)          # stops after ``name`` fires
    x = acts[name]

``sites`` are hook names (the activation is recorded, detached, into the yielded dict;
a later forward in the same block overwrites it) or ``(name, fn)`` pairs whose ``fn(x,
hook)`` runs at that hook point (as any TransformerLens hook), in the order given. The
stop is raised after every site of its hook point has run, and only from the forward
itself: a site that calls model components (e.g. the pre-MLP norm, which fires its hook
point again) does not stop anything. The stop ends the ``with`` block: the forward is the
last statement inside it. Hooks are removed on exit, also when a hook raises.

A reader that visits the layers in order (the thought fit, issue 41) keeps the residual
entering the next block instead of running the forward up to each layer again:
:func:`layer_steps` captures a batch's embedding and the arguments the model's forward
hands each block, and :meth:`LayerSteps.run` runs one block alone on the kept residual,
with whatever reads and edits are in place (a read's stop ends that block's run):

    steps = layer_steps(model, ids)
    with activations_captured(model, [name], stop_after=name) as acts:
        steps.run()                           # block 0 only
    steps.run(advance=True)                   # block 0 again; its output enters block 1
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

from torch import Tensor

from icl_lens.model._per_model import model_cache

Hook = Callable[..., Tensor | None]
Sites = Mapping[str, Hook] | Iterable[str | tuple[str, Hook]]


class NonFiniteActivationError(FloatingPointError):
    """An activation read from the model is NaN or infinite; the message names layer and position."""


class _ForwardStopped(Exception):
    """Raised by the stop hook of one :func:`activations_captured` block, and caught by that block only."""

    def __init__(self, owner: object):
        super().__init__("forward stopped after its last read hook point")
        self.owner = owner


def _pairs(sites: Sites, acts: dict[str, Tensor]) -> list[tuple[str, Hook]]:
    items = sites.items() if isinstance(sites, Mapping) else sites
    if isinstance(items, str):
        raise TypeError("sites must be a list of hook names or (name, fn) pairs, not one string")
    pairs = []
    for site in items:
        if isinstance(site, str):
            pairs.append((site, lambda x, hook, name=site: acts.__setitem__(name, x.detach())))
        elif isinstance(site, tuple) and len(site) == 2 and isinstance(site[0], str) and callable(site[1]):
            pairs.append(site)
        else:
            raise TypeError(f"a site is a hook name or a (name, fn) pair, got {site!r}")
    return pairs


@contextmanager
def activations_captured(model, sites: Sites, *, stop_after: str | None = None) -> Iterator[dict[str, Tensor]]:
    """Within the block, ``sites`` are read during every forward of ``model`` (module docstring).

    Yields ``{name: activation}`` for the sites given as bare hook names. ``stop_after``: a
    hook name; the forward stops once every site there has run (its later layers never
    run) and the block exits quietly. An unknown hook name raises ``KeyError`` (TransformerLens's).
    Hooks are removed on exit, also after an error.
    """
    acts: dict[str, Tensor] = {}
    owner, running = object(), [0]  # running: how many sites are executing (a site may call model components)

    def inside(fn: Hook) -> Hook:
        def counted(x, hook):
            running[0] += 1
            try:
                return fn(x, hook)
            finally:
                running[0] -= 1
        return counted

    def stop(x, hook):
        if running[0] == 0:
            raise _ForwardStopped(owner)

    hooks = [(name, inside(fn)) for name, fn in _pairs(sites, acts)]
    if stop_after is not None:
        hooks.append((stop_after, stop))
    try:
        with hooks_attached(model, hooks):
            yield acts
    except _ForwardStopped as stopped:
        if stopped.owner is not owner:
            raise


def hooked(*modules: torch.nn.Module) -> bool:
    """Whether anything acts on a call of ``modules`` or of a module inside them: a forward or backward hook of its
    own (TransformerLens registers its hook points' hooks there), accelerate's offload hook, or a global module hook
    of torch. Code that skips a module's call when nothing would see it (the weight-first unembedding, a bridge
    norm run once) asks this first."""
    from torch.nn.modules import module as nn_module

    if (nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks or nn_module._global_backward_hooks
            or nn_module._global_backward_pre_hooks):
        return True
    return any(_acted_on(m) for m in modules)


def _acted_on(module: torch.nn.Module) -> bool:
    """:func:`hooked` for one module and those inside it, without global hooks (children read directly: a bridge
    norm asks this of two hook points on every call)."""
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks or module.__dict__.get("_hf_hook") is not None
                or (module._modules and any(_acted_on(m) for m in module._modules.values() if m is not None)))


def _hook_point(model, name: str):
    """``(canonical name, HookPoint)`` of hook ``name`` (an alias allowed), as TransformerLens resolves it, resolved
    once per model, name and compatibility mode; an unknown name raises its ``KeyError`` every time."""
    from transformer_lens.model_bridge.bridge_core import build_alias_to_canonical_map

    points = model_cache(model, "hook_points")
    key = (name, bool(model.compatibility_mode))
    if key not in points:
        hook_dict = model.hook_dict
        points[key] = model._resolve_hook_point(name, build_alias_to_canonical_map(hook_dict), hook_dict)
    return points[key]


@contextmanager
def hooks_attached(model, pairs: list[tuple[str, Hook]]) -> Iterator[None]:
    """``model.hooks(fwd_hooks=pairs)`` (TransformerLens 4.3): the same checks, hook levels and removal on exit, with
    each name's hook point resolved once per model instead of from the whole alias table at every entry (twice: for
    the forward hooks and for the empty backward ones; a thought fit enters hundreds of times). The read door and the
    write door attach every hook through it. Another hooked module (the regression lab's) uses its own ``hooks``."""
    if not hasattr(model, "_resolve_hook_point"):
        with model.hooks(fwd_hooks=pairs):
            yield
        return
    level = getattr(model, "context_level", 0) + 1
    model.context_level = level
    added = []
    try:
        for name, fn in pairs:
            canonical, point = _hook_point(model, name)
            model.check_hooks_to_add(point, canonical, fn, dir="fwd")
            aliases = {}
            if model.compatibility_mode and canonical != point.name:  # as TransformerLens names an aliased hook
                aliases = {"alias_names": ([point.name] if point.name is not None else []) + [canonical]}
            added.append((point, point.add_hook(fn, dir="fwd", level=level, **aliases)))
        yield
    finally:
        try:
            for point, handle in added:
                model._remove_temporary_hook(point, "fwd", handle)
        finally:
            model.context_level -= 1


class ForwardAbandoned(Exception):
    """Raised by :func:`abandoned_when`: the forward was given up because its result is no longer wanted."""


@contextmanager
def abandoned_when(model, stale: Callable[[], bool] | None, sites: Iterable[str]) -> Iterator[None]:
    """Within the block, every forward of ``model`` checks ``stale()`` at each hook point of ``sites``
    (e.g. every block's input) and raises :class:`ForwardAbandoned` once it is true, so a result
    nobody waits for any more (a live view's superseded request) stops at the next block.
    ``stale=None`` adds nothing. The exception leaves the block; hooks are removed on exit."""
    if stale is None:
        yield
        return

    def check(x, hook):
        if stale():
            raise ForwardAbandoned("a newer request is waiting")

    with activations_captured(model, [(name, check) for name in sites]):
        yield


class _EmbeddingRead(Exception):
    """Raised by :func:`layer_steps`'s hook on block 0 once the embedding is read (the rest of the forward is not
    needed); caught by :func:`layer_steps` only."""


class _ArgumentsRead(Exception):
    """Raised by :func:`layer_steps`'s hook on the last block once every block's arguments are read (that block, the
    final norm and the unembedding are not needed); caught by :func:`layer_steps` only."""


def _no_cache(x):
    """A block call's argument with any key/value cache dropped (a block run alone keeps no cache)."""
    from transformers import Cache

    return None if isinstance(x, Cache) else x


class LayerSteps:
    """A batch taken through the blocks one at a time: the residual entering block :attr:`layer` is kept, so
    reading block ``l`` under any edits (:func:`~icl_lens.model.edits_applied`) and hooks
    (:func:`activations_captured`, whose stop ends the block's run) costs one block, not ``l + 1``.

    Made by :func:`layer_steps`. :meth:`run` runs block :attr:`layer` on the kept residual with whatever hooks are
    on the model (``advance=True``: its output becomes the kept residual, entering the next block);
    :meth:`restart` goes back to the embedding. Exact: each block gets the arguments the model's own forward
    gives it (the attention mask and position embeddings of its kind of layer), without a cache.
    """

    def __init__(self, model, embedded: Tensor, calls: list[tuple[tuple, dict]]):
        self.model, self.embedded, self.calls = model, embedded, calls
        self.resid, self.layer = embedded, 0

    def restart(self) -> None:
        self.resid, self.layer = self.embedded, 0

    def run(self, *, advance: bool = False) -> Tensor:
        """Block :attr:`layer`'s output on the kept residual (a read's stop raises out of it, to its
        :func:`activations_captured` block)."""
        if self.layer >= len(self.calls):
            raise IndexError(f"the batch has passed the last block ({len(self.calls) - 1})")
        args, kwargs = self.calls[self.layer]
        out = self.model.blocks[self.layer](self.resid, *args, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        if advance:
            self.resid, self.layer = out, self.layer + 1
        return out


def layer_steps(model, ids: Tensor, known: dict | None = None) -> LayerSteps:
    """``ids`` ``[batch, pos]`` (no attention mask: right padding) at the entrance of block 0, and the arguments
    every block is called with, for :class:`LayerSteps`.

    Costs the embedding of ``ids`` and one forward of its first row alone up to the last block's entrance, in which
    only block 0 computes (the arguments depend on the length and the layer's kind, not on the tokens or on what the
    blocks before return: the mask and position embeddings of one row broadcast over the batch; the blocks between
    hand their input on unchanged, and the last block, the final norm and the unembedding never run);
    ``known``: a dict of the arguments already captured, by length, shared by the batches of one reading (a
    length seen before costs no forward).
    """
    import torch

    blocks = list(model.blocks)
    known = {} if known is None else known
    calls: dict[int, tuple[tuple, dict]] = {}
    embedded: list[Tensor] = []

    def grab(module, args, kwargs, layer):
        calls[layer] = (tuple(_no_cache(a) for a in args[1:]),
                        {k: (False if k == "use_cache" else _no_cache(v)) for k, v in kwargs.items()})
        if layer == len(blocks) - 1:
            raise _ArgumentsRead

    def embedding(module, args, kwargs):
        embedded.append(args[0] if args else kwargs["hidden_states"])
        raise _EmbeddingRead

    first: list = []  # block 0's output: what a block returns (a tensor, or a tuple led by one)

    def passthrough(*args, **kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        return (hidden, *first[0][1:]) if isinstance(first[0], tuple) else hidden

    with torch.no_grad():
        if ids.shape[1] not in known:
            handles = [b.register_forward_pre_hook(lambda m, a, k, layer=l: grab(m, a, k, layer), with_kwargs=True)
                       for l, b in enumerate(blocks)]
            handles.append(blocks[0].register_forward_hook(lambda m, a, out: first.append(out)))
            middle = blocks[1:-1]
            own = [b.__dict__.get("forward") for b in middle]  # an instance's own forward (accelerate's), kept
            for b in middle:
                object.__setattr__(b, "forward", passthrough)  # the instance's, past the bridge's own __setattr__
            try:
                model(ids[:1], return_type=None)
            except _ArgumentsRead:
                pass
            finally:
                for h in handles:
                    h.remove()
                for b, forward in zip(middle, own):
                    if forward is None:
                        b.__dict__.pop("forward", None)
                    else:
                        object.__setattr__(b, "forward", forward)
            known[ids.shape[1]] = [calls[l] for l in range(len(blocks))]
        handle = blocks[0].register_forward_pre_hook(embedding, with_kwargs=True)
        try:
            model(ids, return_type=None)
        except _EmbeddingRead:
            pass
        finally:
            handle.remove()
    return LayerSteps(model, embedded[0].detach(), known[ids.shape[1]])
