"""Every private torch symbol torch_ort uses, looked up here and nowhere else.

One function or constant per feature, each saying what it is for and which torch versions are
known to have its symbol (2.11 and 2.15 are checked: scripts/check_torch.sh). A symbol this torch
lacks disables only its feature: importing torch_ort never fails; the feature either logs once,
when first needed, what it does instead, or raises MissingTorchFeature (naming the feature and
the torch version) when it is asked for and cannot work without the symbol.

Not shimmed: ORTModule's own nn.Module state (self._modules, which holds the wrapped module) and
the _metadata of the state dicts it returns, read with getattr(..., None). ORTModule subclasses
nn.Module and uses its base class's state as every subclass does.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import logging

import torch
import torch.utils.checkpoint as _checkpoint

LOGGER = logging.getLogger("torch_ort")
TORCH_VERSION = torch.__version__


class MissingTorchFeature(RuntimeError):
    """A torch_ort feature that needs a torch symbol this torch version does not have."""

    def __init__(self, feature: str, symbol: str):
        super().__init__(f"{feature} is not available with torch {TORCH_VERSION}: it needs {symbol}, "
                         "which this torch does not have")


_logged: set = set()


def _log_once(feature: str, symbol: str, instead: str, level: int = logging.WARNING) -> None:
    """Once per feature and level: a warning still comes after an info nobody may have seen."""
    if (feature, level) not in _logged:
        _logged.add((feature, level))
        LOGGER.log(level, "torch %s has no %s: %s %s", TORCH_VERSION, symbol, feature, instead)


def _find(path: str):
    """The module or attribute at dotted `path`, or None when this torch has no such thing."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            found = getattr(found, name, None)
        return found
    return None


class _Missing:
    """Stands in for a missing module: any use raises MissingTorchFeature."""

    def __init__(self, feature: str, symbol: str):
        self._error = (feature, symbol)

    def __getattr__(self, name):
        raise MissingTorchFeature(*self.__dict__["_error"])


# --- pytree: flattening ORTModule's inputs and outputs --------------------------------------------
# tree_flatten / tree_unflatten / tree_map / TreeSpec; no public equivalent (torch 2.11, 2.15).
pytree = _find("torch.utils._pytree") or _Missing("ORTModule (flattening inputs and outputs)",
                                                  "torch.utils._pytree")


# --- torch.utils.checkpoint inside ORTModule (refused, or run as a PythonOp) --------------------
# The entry impl(function, args, kwargs, **options) that checkpoint() and its decorator form both
# call (torch 2.15; not in 2.11, whose checkpoint() does the work itself).
_CHECKPOINT_IMPL = getattr(_checkpoint, "_checkpoint_impl", None)
_CHECKPOINT = _checkpoint.checkpoint
_CHECKPOINT_OPTIONS = ("use_reentrant", "preserve_rng_state", "context_fn", "determinism_check",
                       "debug", "early_stop")


def checkpoint_original(function, args: tuple, kwargs: dict, **options):
    """torch's own checkpoint of function(*args, **kwargs) (options: use_reentrant, ...)."""
    if _CHECKPOINT_IMPL is not None:
        return _CHECKPOINT_IMPL(function, args, kwargs, **options)
    return _CHECKPOINT(function, *args, **options, **kwargs)


def route_checkpoints(impl, level: int = logging.INFO):
    """Sends torch.utils.checkpoint calls to impl(function, args, kwargs, **options) until the
    returned undo() is called. Without the entry (torch 2.11) the public checkpoint() is swapped:
    calls through the module attribute are seen, a `checkpoint` imported by name earlier is not
    (said once, at `level`)."""
    if _CHECKPOINT_IMPL is not None:
        previous = _checkpoint._checkpoint_impl
        _checkpoint._checkpoint_impl = impl
        return lambda: setattr(_checkpoint, "_checkpoint_impl", previous)
    _log_once("torch.utils.checkpoint inside ORTModule", "torch.utils.checkpoint._checkpoint_impl",
              "is seen only when called as torch.utils.checkpoint.checkpoint(...): a non-reentrant "
              "checkpoint imported by name before the export is traced inline (neither refused nor "
              "recomputed); reentrant ones are still seen through CheckpointFunction", level)

    @functools.wraps(_CHECKPOINT)
    def checkpoint(function, *args, **kwargs):
        options = {k: kwargs.pop(k) for k in _CHECKPOINT_OPTIONS if k in kwargs}
        return impl(function, args, kwargs, **options)

    previous = _checkpoint.checkpoint
    _checkpoint.checkpoint = checkpoint
    return lambda: setattr(_checkpoint, "checkpoint", previous)


# --- PythonOp: probing a Function that cannot run on fake tensors --------------------------------
def real_tensors():
    """A context in which the export's fake-tensor mode is off, for a probe on real tensors
    (torch._subclasses.fake_tensor.unset_fake_temporarily: torch 2.11, 2.15)."""
    unset = _find("torch._subclasses.fake_tensor.unset_fake_temporarily")
    if unset is None:
        raise MissingTorchFeature("PythonOp for a Function that cannot run on fake tensors",
                                  "torch._subclasses.fake_tensor.unset_fake_temporarily")
    return unset()


# --- partial acceleration's FLOP count: dispatch modes off while a submodule exports -----------
# torch.utils._python_dispatch._disable_current_modes (torch 2.11, 2.15); None: the split reports
# no FLOP share.
disable_dispatch_modes = _find("torch.utils._python_dispatch._disable_current_modes")
TorchDispatchMode = _find("torch.utils._python_dispatch.TorchDispatchMode")


# --- in-place writes and views (PythonOp dirty inputs, FP16_Optimizer masters, outputs) ---------
def version_counter(t: torch.Tensor) -> int:
    """The count of in-place writes to t's storage (Tensor._version: every torch 2.x)."""
    try:
        return t._version
    except AttributeError:
        raise MissingTorchFeature("detecting in-place writes", "Tensor._version") from None


def is_view(t: torch.Tensor) -> bool:
    """Whether t is a view of another tensor (Tensor._is_view: every torch 2.x)."""
    try:
        return t._is_view()
    except AttributeError:
        raise MissingTorchFeature("ORTModule outputs that are views", "Tensor._is_view") from None


# --- binding parameters and buffers by name (the live tensor even after reassignment) -----------
def slot_table(module: torch.nn.Module, name: str) -> dict:
    """The dict of module's own parameters or buffers that holds `name`
    (nn.Module._parameters / _buffers: every torch 2.x)."""
    parameters, buffers = getattr(module, "_parameters", None), getattr(module, "_buffers", None)
    if parameters is None or buffers is None:
        raise MissingTorchFeature("ORTModule (binding parameters)", "nn.Module._parameters/_buffers")
    return parameters if name in parameters else buffers


# --- hooks a graph may have traced (a cached or shared export must not ignore them) ----------------
# nn.Module's per-instance hook dicts and torch.nn.modules.module's global ones (every torch 2.x).
_MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOKS = tuple(_find(f"torch.nn.modules.module._global{name}") for name in _MODULE_HOOKS)


def hooked_module(module: torch.nn.Module) -> str | None:
    """The name of the first module in `module`'s tree with a forward or backward hook ("" for
    `module` itself, "*" for a hook registered on every module), or None."""
    if any(hooks for hooks in _GLOBAL_HOOKS if hooks):
        return "*"
    for name, m in module.named_modules():
        if any(getattr(m, attr, None) for attr in _MODULE_HOOKS):
            return name
    return None


# --- the autograd bridge: state freed when autograd's backward call ends --------------------------
# The engine's queue_callback(fn): fn runs when the running backward call succeeds, and is dropped
# with it when it fails (torch.autograd.Variable._execution_engine: every torch 2.x).
_QUEUE_CALLBACK = _find("torch.autograd.Variable._execution_engine.queue_callback")


def queue_backward_callback(fn) -> None:
    if _QUEUE_CALLBACK is None:
        raise MissingTorchFeature("ORTModule's backward",
                                  "torch.autograd.Variable._execution_engine.queue_callback")
    _QUEUE_CALLBACK(fn)


# --- the ATen fallback: FX targets resolved to ATen overloads -------------------------------------
# The type of torch.ops.aten.<op>.<overload> (torch._ops.OpOverload: torch 2.11, 2.15); without
# it, `()`: nothing is an overload, and the ATen fallback finds no ops.
OpOverload = _find("torch._ops.OpOverload") or ()


def is_op_overload(target) -> bool:
    if not OpOverload:
        _log_once("the ATen fallback", "torch._ops.OpOverload", "is off")
        return False
    return isinstance(target, OpOverload)


def op_schema(overload):
    """The overload's torch.FunctionSchema (OpOverload._schema: torch 2.11, 2.15)."""
    schema = getattr(overload, "_schema", None)
    if schema is None:
        raise MissingTorchFeature("the ATen fallback", "OpOverload._schema")
    return schema


def aten_op(name: str):
    """torch.ops.aten.<name> ('_native_batch_norm_legit.no_stats'), or None: ATen ops with a
    leading underscore are internal and may be renamed (those we translate: torch 2.11, 2.15)."""
    packet, _, overload = name.rpartition(".")
    return getattr(getattr(torch.ops.aten, packet, None), overload, None)


# --- torch.onnx's dynamo exporter internals -------------------------------------------------------
# The module holding the ExportedProgram -> ONNX step and the tracer custom translations record
# nodes into (torch.onnx._internal.exporter._core: torch 2.11, 2.15). Imported on first use.
_ONNX_CORE = "torch.onnx._internal.exporter._core"
ONNX_TRANSLATION = f"{_ONNX_CORE}._exported_program_to_onnx_program"
_ONNX_DISPATCHING = "torch.onnx._internal.exporter._dispatching"  # _core calls its dispatch()


@contextlib.contextmanager
def _wrapped(module_name: str, attr: str, wrap):
    """Within the block module_name.attr is wrap(original); yields False (and changes nothing)
    when this torch has no such function to wrap."""
    module = _find(module_name)
    original = getattr(module, attr, None)
    if original is None:
        yield False
        return
    setattr(module, attr, wrap(original))
    try:
        yield True
    finally:
        setattr(module, attr, original)


def onnx_translation_wrapped(wrap):
    """Within the block torch.onnx.export translates through wrap(original); yields False (and
    changes nothing) when this torch has no such step to wrap."""
    return _wrapped(_ONNX_CORE, "_exported_program_to_onnx_program", wrap)


def onnx_dispatch_wrapped(wrap):
    """Within the block the exporter picks each FX node's translation through wrap(original):
    original(node, registry) -> (translation or None, message), torch's dispatch (the registry's
    custom entry first, then torchlib's). Yields False (and changes nothing) when this torch has
    no such step to wrap."""
    return _wrapped(_ONNX_DISPATCHING, "dispatch", wrap)


def onnx_tracer():
    """The exporter's tracer while a custom translation runs (None outside torch.onnx.export)."""
    core = _find(_ONNX_CORE)
    if core is None or not hasattr(core, "current_tracer"):
        raise MissingTorchFeature("the ATen fallback (com.torch_ort::ATenOp nodes)",
                                  f"{_ONNX_CORE}.current_tracer")
    return core.current_tracer
