"""Copies of an ORTModule (copy.deepcopy, pickle, torch.save(module)): what a copy keeps and
what it builds again (Copyable, a base of ORTModule)."""
from __future__ import annotations

import threading

import torch

from torch_ort.ortmodule.engine import memory_monitor
from torch_ort.ortmodule.engine.plan_cache import PlanCache
from torch_ort.ortmodule.export import python_op
from torch_ort.ortmodule.export.aten_routing import AtenFallback, resolve_aten
from torch_ort.ortmodule.export.translations.aten_op import qualified_name

_RLOCK = type(threading.RLock())
_LOCK_TYPES = (type(threading.Lock()), _RLOCK)


class Copyable(torch.nn.Module):
    # A copy (copy.deepcopy, pickle, torch.save(module)) is an independent ORTModule: the wrapped
    # module copied as PyTorch copies it, the same settings, debug options, fallback state and
    # ATen-fallback ops; none of the engines, runners, memory measurements or locks (C++ objects
    # bound to this instance's parameters): it exports again on its first call, counters at 0.
    _NOT_COPIED = ("_memory", "_plan_cache", "_aten_fallback", "forward", "_last_engine", "_last_runner",
                   "_method_proxy", "_split", "_shared_exports")
    _EMPTIED = ("_changed",)  # copied as empty containers of their type
    _COUNTERS = ("export_count", "engine_build_count", "cache_hit_count")

    def __getstate__(self):
        state, locks = {}, {}
        for name, value in self.__dict__.items():
            if name in self._NOT_COPIED:
                continue
            if name in self._EMPTIED:
                value = type(value)()
            if isinstance(value, _LOCK_TYPES):
                locks[name] = type(value) is _RLOCK  # re-created by __setstate__
                continue
            state[name] = value
        state.update(dict.fromkeys(self._COUNTERS, 0))
        aten = self._aten_fallback
        state["_torch_ort_copy"] = {
            "locks": locks, "aten_enabled": aten.enabled,
            "aten_ops": {qualified_name(op): why for op, why in aten.reasons.items()}}
        return state

    def __setstate__(self, state):
        state = dict(state)
        extra = state.pop("_torch_ort_copy", {})
        super().__setstate__(state)
        for name, reentrant in extra.get("locks", {}).items():
            self.__dict__[name] = threading.RLock() if reentrant else threading.Lock()
        self.__dict__["_memory"] = memory_monitor.MemoryMonitor(self._settings)
        self.__dict__["_split"] = None  # rebuilt around the copy's own submodules when it runs eager
        self.__dict__["_shared_exports"] = None
        self.__dict__["_last_engine"] = self.__dict__["_last_runner"] = None  # stats(): nothing ran yet
        self.__dict__["_plan_cache"] = PlanCache(self._settings.max_cached_graphs, self._memory.forget)
        aten = AtenFallback(extra.get("aten_enabled", self._settings.aten_fallback))
        aten.add({op: why for op, why in ((resolve_aten(n.replace("::", ".")), why)
                                          for n, why in extra.get("aten_ops", {}).items()) if op})
        self.__dict__["_aten_fallback"] = aten
        try:
            python_op.install()  # another process: the PythonOp runner (a missing _C fails at the call)
        except ImportError:
            pass
