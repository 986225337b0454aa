"""PythonOp: user torch.autograd.Functions run their own forward and backward inside the engine.

Each call of a user Function inside the exported module becomes one `com.torch_ort::PythonOp`
node (python_op_export.py) whose attributes are only a registry id and a name. The Function class,
its non-tensor arguments and how many results it returns stay in this process's registry (a
CallSite per id), so a model file never names Python to import or run: an id this process did not
register is an error.

At run time the PythonOp kernel calls `run(func_id, args, record)`: apply() itself, so
`ctx.save_for_backward`, `needs_input_grad`, `mark_non_differentiable`, `mark_dirty`, non-tensor
arguments and None gradients behave as in eager; the ATenOpGrad kernel's backward over the
recorded results then calls the Function's backward exactly once. Inputs the Function modifies in
place (learnt at export) are cloned first, so the graph stays functional.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
from dataclasses import dataclass

import torch

DOMAIN_OP = "com.torch_ort::PythonOp"
ORIGINAL_APPLY = torch.autograd.Function.__dict__["apply"]  # python_op_export patches it per export


def original_apply(cls, *args, **kwargs):
    return ORIGINAL_APPLY.__get__(None, cls)(*args, **kwargs)


def qualified_name(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass
class CallSite:
    function: type                 # the torch.autograd.Function subclass
    template: list                 # per apply() argument: ("T", node input index) or ("C", value)
    kwargs: dict                   # constant keyword arguments
    num_outputs: int               # tensors apply() returns
    dirty: tuple = ()              # node inputs the forward modifies in place (cloned per call)
    name: str = ""

    def arguments(self, tensors) -> list:
        return [tensors[v] if kind == "T" else v for kind, v in self.template]


_SITES: dict[int, CallSite] = {}
_IDS = itertools.count(1)
_STATE = threading.local()  # .depth: inside a probe or a run (nested Functions run as they are)


def depth() -> int:
    return getattr(_STATE, "depth", 0)


@contextlib.contextmanager
def nested():
    _STATE.depth = depth() + 1
    try:
        yield
    finally:
        _STATE.depth -= 1


def register(site: CallSite) -> int:
    """A new registry id for one exported call of a Function."""
    func_id = next(_IDS)
    _SITES[func_id] = site
    return func_id


def release(ids) -> None:
    for i in ids:
        _SITES.pop(i, None)


def registered(func_id: int) -> CallSite | None:
    return _SITES.get(func_id)


# --- run time --------------------------------------------------------------------------------
def run(func_id: int, args: list, record: bool) -> list:
    """The PythonOp kernel's callback (installed into torch_ort._C at import)."""
    site = _SITES.get(func_id)
    if site is None:
        raise RuntimeError(f"PythonOp id {func_id} is not registered in this process: PythonOp nodes "
                           "only run Functions exported by this process's ORTModules")
    tensors = [t.clone() if i in site.dirty and t is not None else t for i, t in enumerate(args)]
    try:
        with nested(), (torch.enable_grad() if record else torch.no_grad()):
            out = original_apply(site.function, *site.arguments(tensors), **site.kwargs)
    except BaseException as e:
        _STATE.error = e  # re-raised as itself by take_error()
        raise
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(outs) != site.num_outputs or not all(isinstance(o, torch.Tensor) for o in outs):
        raise RuntimeError(f"PythonOp {site.name}: forward returned {describe(out)}; at export it "
                           f"returned {site.num_outputs} tensor(s)")
    return outs


def take_error() -> BaseException | None:
    """The Python exception a Function raised inside the engine (once), to re-raise as itself."""
    error = getattr(_STATE, "error", None)
    _STATE.error = None
    return error


@contextlib.contextmanager
def errors_as_raised():
    """Around engine calls: an exception a Function raised comes out as itself (the engine only
    carries its text), chained to the engine's error that names the node."""
    take_error()
    try:
        yield
    except RuntimeError as engine_error:
        original = take_error()
        if original is None:
            raise
        raise original.with_traceback(original.__traceback__) from engine_error


def describe(out) -> str:
    if isinstance(out, (tuple, list)):
        return f"{len(out)} values ({', '.join(type(o).__name__ for o in out)})"
    return f"a {type(out).__name__}"


_INSTALL_LOCK = threading.Lock()
_installed = False


def install() -> None:
    """Installs `run` into the engine once per process: replacing the engine's callback while
    another thread's PythonOp kernel is calling it would free the callback under that call."""
    global _installed
    with _INSTALL_LOCK:
        if _installed:
            return
        from torch_ort import _C

        _C.set_python_op_runner(run)
        _installed = True
