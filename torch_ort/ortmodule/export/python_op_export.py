"""Export side of PythonOp (python_op.py): while ORTModule exports, `opaque_functions()` intercepts
`Function.apply`, and each call of a user Function becomes one PythonOp node
(torch.onnx.ops.symbolic_multi_out) whose inputs are the call's tensors. An apply reached without
that patch — a reference taken before the export (`self.fn = F.apply`, Megatron/Apex style) binds
torch's own apply — still calls the class's forward, which is wrapped during the export to do the
same: otherwise the exporter would inline the forward and differentiate it, silently ignoring the
Function's backward.

Output dtypes and shapes come from a probe run of the real forward on the export's fake tensors
(symbolic dims), or, if the Function cannot run on fake tensors (numpy, a custom kernel), on random
tensors of the traced sizes. The probe also learns which inputs the Function modifies in place.

torch.utils.checkpoint regions raise CheckpointNotAllowedError unless
ORTMODULE_ALLOW_AUTOGRAD_CHECKPOINT=1; allowed, they run as a PythonOp of torch's reentrant
CheckpointFunction (recompute in backward, as in eager), or inline when custom autograd is off.
Under ORTMODULE_MEMORY_OPT_LEVEL>=1 (what Hugging Face's gradient_checkpointing_enable() pairs
with) the checkpoint is stripped instead, as ORT does: the region is traced inline and the engine's
layer-wise recompute decides what backward recomputes.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import threading
import types
import weakref
from dataclasses import dataclass, field

import torch
import torch.utils.checkpoint as checkpoint_module

from torch_ort import _compat
from torch_ort._compat import pytree
from torch_ort.ortmodule.policy.fallback_policy import FallbackPolicy, ORTModuleError
from torch_ort.ortmodule.policy.debug_options import LOGGER
from torch_ort.ortmodule.export.python_op import (
    DOMAIN_OP,
    ORIGINAL_APPLY,
    CallSite,
    depth,
    describe,
    nested,
    original_apply,
    qualified_name,
    register,
    release,
)


class CheckpointNotAllowedError(ORTModuleError):
    """torch.utils.checkpoint inside an ORTModule without ORTMODULE_ALLOW_AUTOGRAD_CHECKPOINT=1.
    No fallback flag covers it: it always raises, saying how to allow it."""

    policy = FallbackPolicy(0)


@dataclass(frozen=True)
class FunctionPolicy:
    """How Functions export (ORTMODULE_ENABLE_CUSTOM_AUTOGRAD, _ALLOW_AUTOGRAD_CHECKPOINT,
    _SKIPPED_AUTOGRAD_FUNCTIONS)."""

    custom_autograd: bool = True
    allow_checkpoint: bool = False
    skipped: frozenset = frozenset()
    strip_checkpoint: bool = False  # ORTMODULE_MEMORY_OPT_LEVEL>=1: the engine recomputes instead


@dataclass
class Capture:
    """What one export registered; `ids` are released when the export result is dropped."""

    policy: FunctionPolicy
    remap: dict = field(default_factory=dict)  # id(copied module) -> original (deepcopy export)
    ids: list = field(default_factory=list)
    names: list = field(default_factory=list)

    def attach(self, owner) -> None:
        if self.ids:
            weakref.finalize(owner, release, list(self.ids))

    def discard(self) -> None:
        release(self.ids)
        self.ids.clear()


def _checkpoint_error(module_hint: str) -> CheckpointNotAllowedError:
    return CheckpointNotAllowedError(
        f"torch.utils.checkpoint is used inside {module_hint}; ORTModule runs checkpointed regions "
        "only when ORTMODULE_ALLOW_AUTOGRAD_CHECKPOINT=1 (they then recompute in backward as in "
        "eager), or remove the checkpoint call")


@contextlib.contextmanager
def opaque_functions(capture: Capture, module_name: str):
    """Within this block (one export), Function.apply emits PythonOp nodes (see module doc).
    The patches are process-wide (exporter.EXPORT_LOCK keeps exports one at a time) but act only
    in the exporting thread: another thread's eager Functions and checkpoints run as they are
    (torch's proxy mode shows through in other threads, so _tracing() alone cannot tell)."""

    policy = capture.policy
    exporter_thread = threading.get_ident()
    routed = threading.local()  # .cls: the Function whose forward our own apply is about to run
    stripped = []  # checkpoint regions traced inline (ORTMODULE_MEMORY_OPT_LEVEL>=1)

    def strip(function, *args, **kwargs):
        if not stripped:
            LOGGER.info("ORTMODULE_MEMORY_OPT_LEVEL>=1: torch.utils.checkpoint regions in %s are "
                        "traced inline; the engine's layer-wise recompute replaces them", module_name)
        stripped.append(function)
        return function(*args, **kwargs)

    def run_original(cls, *args, **kwargs):
        routed.cls = cls
        try:
            return original_apply(cls, *args, **kwargs)
        finally:
            routed.cls = None

    def apply(cls, *args, **kwargs):
        if depth() or threading.get_ident() != exporter_thread or not _tracing():
            return run_original(cls, *args, **kwargs)
        if cls is checkpoint_module.CheckpointFunction:
            if policy.strip_checkpoint:  # apply(function, preserve_rng_state, *args)
                return strip(args[0], *args[2:])
            if not policy.allow_checkpoint:
                raise _checkpoint_error(module_name)
        elif cls.__module__.startswith("torch."):
            return run_original(cls, *args, **kwargs)  # torch's own (custom ops' autograd, ...)
        if not policy.custom_autograd or qualified_name(cls) in policy.skipped:
            return run_original(cls, *args, **kwargs)  # the exporter inlines its forward
        return _emit(capture, cls, args, kwargs)

    def forward_called(cls, args: tuple, forward):
        """A user Function's forward is running: through our apply (run it), or through an apply
        that bypassed the patch (emit the PythonOp, as our apply would have)."""
        if getattr(routed, "cls", None) is not None and issubclass(routed.cls, cls):
            routed.cls = None  # a Function its own forward applies again is a new call
            return forward()
        if depth() or threading.get_ident() != exporter_thread or not _tracing():
            return forward()
        if not policy.custom_autograd or qualified_name(cls) in policy.skipped:
            return forward()
        LOGGER.info("PythonOp: %s was applied through a reference to its apply taken before the "
                    "export; it runs as a PythonOp all the same", qualified_name(cls))
        return _emit(capture, cls, args, {})

    def checkpoint_impl(function, args, kwargs, **options):
        if threading.get_ident() != exporter_thread:
            return _compat.checkpoint_original(function, args, kwargs, **options)
        if policy.strip_checkpoint:
            return strip(function, *args, **kwargs)
        if not policy.allow_checkpoint:
            raise _checkpoint_error(module_name)
        if policy.custom_autograd and not kwargs and options.get("use_reentrant") is False:
            # Non-reentrant checkpoint recomputes the same way; run it as the reentrant Function.
            keep_rng = options.get("preserve_rng_state", True)
            return checkpoint_module.CheckpointFunction.apply(function, keep_rng, *args)
        return _compat.checkpoint_original(function, args, kwargs, **options)

    torch.autograd.Function.apply = classmethod(apply)
    # Where torch hides some checkpoints from us, say so loudly only to a user who allowed them.
    undo_checkpoints = _compat.route_checkpoints(
        checkpoint_impl, logging.WARNING if policy.allow_checkpoint else logging.INFO)
    try:
        with _forwards_watched(forward_called):
            yield capture
    finally:
        torch.autograd.Function.apply = ORIGINAL_APPLY
        undo_checkpoints()


def _user_functions() -> list:
    """Every torch.autograd.Function subclass defined now outside torch whose class body defines
    forward."""
    found, stack = [], [torch.autograd.Function]
    seen = set()
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub in seen:
                continue
            seen.add(sub)
            stack.append(sub)
            if not sub.__module__.startswith("torch.") and isinstance(sub.__dict__.get("forward"), staticmethod):
                found.append(sub)
    return found


@contextlib.contextmanager
def _forwards_watched(called):
    """Within the block, each user Function's forward first asks called(cls, args, run): the
    Function's own inputs (after ctx, when forward takes one) and a callable running the real one."""
    wrapped = []
    for cls in _user_functions():
        raw = cls.__dict__["forward"]
        takes_ctx = cls.setup_context is torch.autograd.Function.setup_context  # no setup_context

        def forward(*args, _cls=cls, _fn=raw.__func__, _ctx=takes_ctx):
            # The class applied: ctx names it (a subclass may inherit this forward).
            applied = getattr(type(args[0]), "_forward_cls", _cls) if _ctx and args else _cls
            return called(applied, args[1:] if _ctx else args, lambda: _fn(*args))

        cls.forward = staticmethod(functools.wraps(raw.__func__)(forward))
        wrapped.append((cls, raw))
    try:
        yield
    finally:
        for cls, raw in wrapped:
            cls.forward = raw


def _tracing() -> bool:
    """True while torch.export traces (a proxy mode is active)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    return get_proxy_mode() is not None


def _remap(value, remap: dict):
    """A constant argument that names a module of the exported copy names the original instead."""
    if isinstance(value, torch.nn.Module):
        return remap.get(id(value), value)
    if isinstance(value, types.MethodType) and id(value.__self__) in remap:
        return types.MethodType(value.__func__, remap[id(value.__self__)])
    if isinstance(value, functools.partial):
        return functools.partial(_remap(value.func, remap), *[_remap(a, remap) for a in value.args],
                                 **{k: _remap(v, remap) for k, v in value.keywords.items()})
    return value


def _emit(capture: Capture, cls, args: tuple, kwargs: dict):
    name = qualified_name(cls)
    tensors, template = [], []
    for a in args:
        if isinstance(a, torch.Tensor):
            template.append(("T", len(tensors)))
            tensors.append(a)
        else:
            if any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves(a)):
                raise RuntimeError(f"PythonOp {name}: an argument holds tensors inside a "
                                   f"{type(a).__name__}; pass tensors to apply() directly")
            template.append(("C", _remap(a, capture.remap)))
    if any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves(kwargs)):
        raise RuntimeError(f"PythonOp {name}: tensors passed as keyword arguments are not supported")
    kwargs = {k: _remap(v, capture.remap) for k, v in kwargs.items()}
    site = CallSite(cls, template, kwargs, 0, name=name)
    outs, single, dirty = _probe(site, tensors)
    site.num_outputs, site.dirty = len(outs), dirty
    func_id = register(site)
    capture.ids.append(func_id)
    capture.names.append(name)
    results = torch.onnx.ops.symbolic_multi_out(
        DOMAIN_OP, tensors, {"func_id": func_id, "name": name},
        dtypes=[o.dtype for o in outs], shapes=[_symbolic_shape(o, tensors) for o in outs])
    LOGGER.info("PythonOp: %s runs as its own forward/backward (registry id %d)", name, func_id)
    return results[0] if single else tuple(results)


def _probe(site: CallSite, tensors: list):
    """Runs the Function once outside the trace to learn its results (fake tensors first)."""
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    def call(inputs):
        # Floating inputs become non-leaf tensors requiring grad: the Function sees requires_grad
        # as it will when trained, and may modify them in place (their version counter moves).
        probe = [t.detach().requires_grad_(True).clone() if t.is_floating_point() else t.detach()
                 for t in inputs]
        versions = [_compat.version_counter(p) for p in probe]
        with nested(), torch.enable_grad():
            out = original_apply(site.function, *site.arguments(probe), **site.kwargs)
        moved = (i for i, (p, v) in enumerate(zip(probe, versions)) if _compat.version_counter(p) != v)
        return out, tuple(moved)

    with disable_proxy_modes_tracing():
        try:
            out, dirty = call(tensors)
        except Exception as fake_error:
            LOGGER.debug("PythonOp %s: fake-tensor probe failed (%s); probing with real tensors",
                         site.name, fake_error)
            with _compat.real_tensors():
                real = [_real_like(t) for t in tensors]
                out, dirty = call(real)
                out = pytree.tree_map_only(torch.Tensor, lambda t: _HintShaped(t), out)
    single = not isinstance(out, (tuple, list))
    outs = [out] if single else list(out)
    for o in outs:
        if not isinstance(o, (torch.Tensor, _HintShaped)):
            raise RuntimeError(f"PythonOp {site.name}: forward returned {describe(out)}; only "
                               "tensors can be outputs of a Function inside ORTModule")
    return outs, single, dirty


class _HintShaped:
    """A real probe result standing in for a fake one: dtype and concrete sizes."""

    def __init__(self, t: torch.Tensor):
        self.dtype, self.shape = t.dtype, tuple(t.shape)


def _real_like(t: torch.Tensor) -> torch.Tensor:
    shape = [_hint(d) for d in t.shape]
    if t.is_floating_point():
        return torch.randn(shape, dtype=t.dtype)
    return torch.zeros(shape, dtype=t.dtype)


def _hint(d) -> int:
    return d.node.hint if isinstance(d, torch.SymInt) and d.node.hint is not None else int(d)


def _symbolic_shape(out, tensors: list) -> list:
    """The result's dims in terms of the inputs' traced dims wherever they can be expressed so."""
    symbols = {}
    for t in tensors:
        for d in t.shape:
            if isinstance(d, torch.SymInt):
                symbols.setdefault(d.node.expr, d)
    hints = {}
    for t in tensors:
        for d in t.shape:
            hints.setdefault(_hint(d), d)
    dims = []
    for d in out.shape:
        if isinstance(d, torch.SymInt):
            rebuilt = _rebuild(d.node.expr, symbols)
            dims.append(rebuilt if rebuilt is not None else _hint(d))
        elif isinstance(out, _HintShaped) and isinstance(hints.get(d), torch.SymInt):
            dims.append(hints[d])  # a probed size equal to a traced input size: assume it is that
        else:
            dims.append(int(d))
    return dims


def _rebuild(expr, symbols: dict):
    """A sympy expression over the inputs' symbols rebuilt from their traced SymInts (or None)."""
    import sympy

    if expr in symbols:
        return symbols[expr]
    if isinstance(expr, sympy.Integer):
        return int(expr)
    parts = [_rebuild(a, symbols) for a in expr.args]
    if not expr.args or any(p is None for p in parts):
        return None
    if isinstance(expr, sympy.Add):
        return functools.reduce(lambda a, b: a + b, parts)
    if isinstance(expr, sympy.Mul):
        return functools.reduce(lambda a, b: a * b, parts)
    if type(expr).__name__ == "FloorDiv":
        return parts[0] // parts[1]
    return None
