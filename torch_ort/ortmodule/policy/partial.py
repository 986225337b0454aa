"""Partial acceleration: when the engine cannot take a module as a whole, the largest submodules
it can take run in the engine and the rest of the forward runs in eager PyTorch.

A module whose export or engine build fails with one of the four FALLBACK_UNSUPPORTED_* kinds,
under a policy that lets that kind fall back, runs its own forward eagerly from then on, with each
candidate child called through an ORTModule of its own. A child that cannot run in the engine
either splits the same way, so the engine gets the largest submodules that can run there: every
transformer block while a data-dependent head stays eager, or the attention and the MLP of the one
block that branches on a value. ORTMODULE_PARTIAL_ACCELERATION=0 runs the whole module eagerly
instead.

The children are swapped into their parents' `_modules` only while the forward runs, so outside
a call the module tree is the user's own: state_dict keys, named_modules, parameters, and the
module objects a user holds are unchanged. Candidates are the children that hold a parameter and
are more than a single torch.nn layer (one layer is one kernel in eager PyTorch: the engine would
add a call boundary and have nothing to fuse), that are not ORTModules already and not managed by
FSDP2; containers without a forward of their own (ModuleList, ModuleDict) are looked through, their
items being what the parent calls. The largest single layers join them after the first call, which
counts the FLOPs each spends: one that spent at least a quarter of the forward's (an LM head over a
large vocabulary, when the body around it cannot run in the engine) runs in the engine too.

Identical submodules (the blocks of a loop: the same classes, structure, parameter names, shapes
and dtypes, and input schema — the key of the graph cache on disk) share one export within the
process (SharedExports): the first step exports a loop of blocks once, not once per block.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
from typing import TYPE_CHECKING, Any, Iterator

import torch

from torch_ort import _compat
from torch_ort.ortmodule.policy.compositions import fsdp_managed
from torch_ort.ortmodule.policy.fallback_policy import (
    FallbackPolicy,
    ORTModuleError,
    ORTModuleTorchModelException,
    SubmoduleStatus,
)

if TYPE_CHECKING:
    from torch_ort.ortmodule.export.exporter import ExportResult
    from torch_ort.ortmodule.ortmodule import ORTModule

# The failure kinds a split can help with: the engine may take a part of the module even when it
# cannot take all of it. A forced fallback or a bad initialization concerns every part alike.
SPLIT_KINDS = (FallbackPolicy.FALLBACK_UNSUPPORTED_DEVICE | FallbackPolicy.FALLBACK_UNSUPPORTED_DATA
               | FallbackPolicy.FALLBACK_UNSUPPORTED_TORCH_MODEL
               | FallbackPolicy.FALLBACK_UNSUPPORTED_ONNX_MODEL)

_REASON_CHARS = 160  # of a submodule's reason, in the one warning (the status has it whole)
LAYER_SHARE = 0.25  # of the forward's FLOPs, above which a single layer runs in the engine too
_counting = threading.local()  # .counter: the _FlopCount of a split's first call in this thread


def counting() -> bool:
    return getattr(_counting, "counter", None) is not None


class _FlopCount(_compat.TorchDispatchMode or object):
    """The FLOPs of every operator torch.utils.flop_counter has a formula for (matrix products,
    convolutions, attention), as they reach the dispatcher: eager ones and those the engine's
    kernels call alike; `engine` holds those made while a submodule's engine ran."""

    def __init__(self):
        super().__init__()
        from torch.utils.flop_counter import flop_registry
        self._formulas = flop_registry
        self.total = self.engine = 0
        self.in_engine = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = self._formulas.get(func._overloadpacket)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
            self.total += flops
            if self.in_engine:
                self.engine += flops
        return out


_NOTHING = contextlib.nullcontext()  # what the hooks below are on every call but a counted one


class _InEngine:
    """While entered, what the counter sees is the engine's."""

    def __init__(self, counter: "_FlopCount"):
        self._counter = counter

    def __enter__(self):
        self._counter.in_engine += 1

    def __exit__(self, *exc):
        self._counter.in_engine -= 1


def engine_running():
    """Around a submodule's engine call: during a counted call, what it computes counts as the
    engine's."""
    counter = getattr(_counting, "counter", None)
    return _NOTHING if counter is None else _InEngine(counter)


def uncounted():
    """Around an export and engine build: during a counted call, the count's dispatch mode must
    not see the exporter's tracing."""
    return _compat.disable_dispatch_modes() if counting() else _NOTHING


def splits(error: ORTModuleError) -> bool:
    """True when a module that failed with `error` may still run parts of itself in the engine."""
    return bool(error.policy & SPLIT_KINDS)


def _has_forward(module: torch.nn.Module) -> bool:
    return type(module).forward is not torch.nn.Module.forward


def _single_layer(module: torch.nn.Module) -> bool:
    return not module._modules and type(module).__module__.startswith("torch.nn.")


def refuse_outputs_recorded_outside(module: torch.nn.Module) -> None:
    """Raises ORTModuleTorchModelException (the module then runs eagerly, and its submodules where
    they can) while hooks inside `module` record outputs for its caller (a whole model collects
    them inside its own graph, so it is not refused)."""
    recorded = outputs_recorded_outside(module)
    if recorded:
        raise ORTModuleTorchModelException(
            f"{type(module).__name__}: forward hooks inside it record {', '.join(recorded)} for the "
            "calling model (transformers' output capturing), which a graph cannot do on every call; "
            "it runs eagerly, and its submodules where they can")


def outputs_recorded_outside(module: torch.nn.Module) -> list[str]:
    """What forward hooks in `module`'s subtree are recording right now into state its caller
    holds: `transformers`' output capturing (router logits for the load-balancing loss, hidden
    states, attentions) collects into a context variable the model's forward sets around the
    call. Traced into this module's graph, such a hook would record the export's placeholder
    tensors once and nothing afterwards; a module that returns its outputs itself is unaffected.
    Empty when nothing records (the usual case)."""
    import sys
    capturing = sys.modules.get("transformers.utils.output_capturing")
    collector = getattr(capturing, "_active_collector", None)
    active = collector.get() if collector is not None else None
    if not active:
        return []
    keys = set()
    for m in module.modules():
        for hook in (*m._forward_hooks.values(), *m._forward_pre_hooks.values()):
            code = getattr(hook, "__code__", None)
            if getattr(hook, "__module__", None) != capturing.__name__ or code is None or "key" not in code.co_freevars:
                continue
            key = hook.__closure__[code.co_freevars.index("key")].cell_contents
            if key in active:
                keys.add(key)
    return sorted(keys)


class SharedExports:
    """The exports of a split's submodules in memory, by the graph cache's key: a runner whose key
    is there uses that graph (the parameters bind by name to its own module) instead of exporting.
    Graphs that run Python Functions (PythonOp) are not shared."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[ExportResult, list[str]]] = {}

    def load(self, key: str) -> tuple[ExportResult, list[str]] | None:
        """(a copy of the export, its ATen fallback op names), or None."""
        with self._lock:
            hit = self._entries.get(key)
        if hit is None:
            return None
        result, ops = hit
        return dataclasses.replace(
            result, raw_model=None, shared=True, stored=False, param_names=list(result.param_names),
            static_dims=[list(d) for d in result.static_dims], input_names=list(result.input_names),
            buffer_updates=list(result.buffer_updates), out_constants=dict(result.out_constants)), list(ops)

    def store(self, key: str, result: ExportResult, ops: list[str]) -> None:
        if not result.python_ops:
            with self._lock:
                self._entries[key] = (result, list(ops))

    def drop(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)


@dataclasses.dataclass
class _Entry:
    parent: torch.nn.Module
    key: str                 # the child's name in parent._modules
    name: str                # its qualified name under the split module
    wrapper: "ORTModule"     # around the child (wrapper.module)


class Split:
    """The children of one module that run through ORTModules of their own while the module's
    forward runs eagerly."""

    def __init__(self, owner: "ORTModule", wrap: type["ORTModule"]):
        """`wrap`: the ORTModule class (given, so that this module need not import it)."""
        self._module = owner.module
        self._lock = threading.Lock()
        # one store for the whole tree of splits under the outermost module
        exports = owner._shared_exports or SharedExports()
        self._depth = 0  # calls in flight (threads, or a forward calling the module again)
        wrappers: dict[int, "ORTModule"] = {}
        self.entries: list[_Entry] = []
        # (FLOPs in the submodules' engines, FLOPs of the whole forward), counted on the first call
        self.flops: tuple[int, int] | None = None

        # single layers the module's forward calls itself: taken too if they do much of the work
        self._layers: list[tuple[torch.nn.Module, str, str, torch.nn.Module]] = []

        def candidate(m: torch.nn.Module) -> bool:
            return (not isinstance(m, wrap) and not fsdp_managed(m) and next(m.parameters(), None) is not None)

        def wrapper_of(child: torch.nn.Module) -> "ORTModule":
            wrapper = wrappers.get(id(child))
            if wrapper is None:
                wrapper = wrappers[id(child)] = wrap(child, owner._debug)
                wrapper._fallback.quiet = True  # the owner reports the whole split once
                wrapper._shared_exports = exports
            return wrapper

        def walk(parent: torch.nn.Module, prefix: str) -> None:
            for key, child in parent._modules.items():
                if child is None:
                    continue
                if not _has_forward(child):
                    walk(child, f"{prefix}{key}.")
                elif candidate(child) and _single_layer(child):
                    self._layers.append((parent, key, prefix + key, child))
                elif candidate(child):
                    self.entries.append(_Entry(parent, key, prefix + key, wrapper_of(child)))

        walk(self._module, "")
        self._wrapper_of = wrapper_of
        inside = {id(m) for e in self.entries for m in e.wrapper.module.modules()}
        self._layers = [layer for layer in self._layers if id(layer[3]) not in inside]  # shared: leave

    @contextlib.contextmanager
    def _swapped(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                for e in self.entries:
                    e.parent._modules[e.key] = e.wrapper
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    for e in self.entries:
                        e.parent._modules[e.key] = e.wrapper.module

    def run(self, args: tuple, kwargs: dict) -> Any:
        """The module's forward, eagerly, its candidate children through their ORTModules. The
        first call of the outermost split counts the forward's FLOPs, and those spent while a
        submodule's engine ran (engine_flop_share)."""
        with self._swapped():
            if self.flops is not None or counting() or _compat.disable_dispatch_modes is None:
                return self._module(*args, **kwargs)
            counter = _FlopCount()
            _counting.counter = counter
            layer_flops, hooks = self._watch_layers(counter)
            try:
                with counter:
                    out = self._module(*args, **kwargs)
            finally:
                _counting.counter = None
                for h in hooks:
                    h.remove()
            self.flops = (counter.engine, counter.total)
        self._take_large_layers(layer_flops, counter.total)
        return out

    def _watch_layers(self, counter: "_FlopCount") -> tuple[dict[int, int], list]:
        """Hooks that count, per single layer the forward calls eagerly, the FLOPs it spends."""
        flops: dict[int, int] = {}
        started: dict[int, int] = {}
        hooks = []
        for _, _, _, layer in self._layers:
            def pre(module, args, key=id(layer)):
                started[key] = counter.total

            def post(module, args, output, key=id(layer)):
                flops[key] = flops.get(key, 0) + counter.total - started.pop(key, counter.total)

            hooks += [layer.register_forward_pre_hook(pre), layer.register_forward_hook(post)]
        return flops, hooks

    def _take_large_layers(self, layer_flops: dict[int, int], total: int) -> None:
        """A single layer that spent at least LAYER_SHARE of the first call's FLOPs (an LM head over
        a large vocabulary) runs in the engine from the next call on, which counts again."""
        large = [layer for layer in self._layers if total and layer_flops.get(id(layer[3]), 0) >= LAYER_SHARE * total]
        if not large:
            return
        with self._lock:
            for layer in large:
                parent, key, name, module = layer
                self.entries.append(_Entry(parent, key, name, self._wrapper_of(module)))
                self._layers.remove(layer)
            self.flops = None

    def statuses(self, prefix: str = "") -> Iterator[SubmoduleStatus]:
        """Where each candidate runs, in module order; a child that split is followed by its own."""
        for e in self.entries:
            name, wrapper = prefix + e.name, e.wrapper
            status = wrapper._fallback.status
            if status is not None and wrapper._split is not None:
                yield SubmoduleStatus(name, "split", status.reason, status.error_type)
                yield from wrapper._split.statuses(name + ".")
            elif status is not None:
                yield SubmoduleStatus(name, "eager", status.reason, status.error_type)
            elif wrapper._last_engine is not None:
                yield SubmoduleStatus(name, "engine", "", "")
            else:
                yield SubmoduleStatus(name, "not called", "", "")

    def _engine_modules(self) -> Iterator[torch.nn.Module]:
        """The submodules that run in the engine, at every depth of the split."""
        for e in self.entries:
            wrapper = e.wrapper
            if wrapper._fallback.status is not None and wrapper._split is not None:
                yield from wrapper._split._engine_modules()
            elif wrapper._fallback.status is None and wrapper._last_engine is not None:
                yield wrapper.module

    def engine_parameter_share(self) -> float:
        """The share of the module's parameter elements that the engine's submodules hold (a
        parameter shared by several modules counts once)."""
        total = {id(p): p.numel() for p in self._module.parameters()}
        inside = {id(p): p.numel() for m in self._engine_modules() for p in m.parameters()}
        return sum(inside.values()) / max(1, sum(total.values()))

    def engine_flop_share(self) -> float | None:
        """The share of the forward's FLOPs (matrix products, convolutions, attention) spent in
        the submodules' engines, as counted on the first call; None before it, or when the
        forward has no such operation."""
        if self.flops is None or not self.flops[1]:
            return None
        return self.flops[0] / self.flops[1]

    def describe(self) -> str:
        """The split in one paragraph, for the one warning."""
        groups: dict[str, list[SubmoduleStatus]] = {}
        for s in self.statuses():
            groups.setdefault(s.runs, []).append(s)
        if not groups.get("engine"):
            return "no submodule could run in the engine instead; the whole module runs eagerly"
        flops = self.engine_flop_share()
        parts = [f"in the engine: {_names(s.name for s in groups['engine'])} "
                 f"({self.engine_parameter_share():.0%} of the parameters"
                 + (f", {flops:.0%} of the forward's FLOPs)" if flops is not None else ")")]
        for runs in ("split", "eager"):
            for s in groups.get(runs, ()):
                reason = s.reason.splitlines()[0] if s.reason else ""
                if len(reason) > _REASON_CHARS:
                    reason = reason[:_REASON_CHARS] + "..."
                what = "its submodules where they can" if runs == "split" else "eagerly"
                parts.append(f"{s.name} runs {what} ({s.error_type}: {reason})")
        if groups.get("not called"):
            parts.append(f"not called yet: {_names(s.name for s in groups['not called'])}")
        return "; ".join(parts)


def _names(names) -> str:
    """'blocks.0-3, head' for blocks.0, blocks.1, blocks.2, blocks.3, head."""
    out: list[list] = []  # [prefix, first, last] runs of consecutive indices, or [name]
    for name in names:
        m = re.fullmatch(r"(.*\.)(\d+)", name)
        if m and out and len(out[-1]) == 3 and out[-1][0] == m.group(1) and out[-1][2] + 1 == int(m.group(2)):
            out[-1][2] += 1
        elif m:
            out.append([m.group(1), int(m.group(2)), int(m.group(2))])
        else:
            out.append([name])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}{r[1]}" + (f"-{r[2]}" if r[2] > r[1] else "")
                     for r in out)
