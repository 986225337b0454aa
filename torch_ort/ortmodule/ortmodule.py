"""ORTModule: a drop-in nn.Module whose forward and backward run through the torch_ort engine."""
from __future__ import annotations

import dataclasses
import os
import threading
import types
import weakref
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import torch

from torch_ort._compat import pytree
from torch_ort.ortmodule import bridge, hf, inference_export, memory_monitor, partial, progress, python_op
from torch_ort.ortmodule.aten_routing import AtenFallback, resolve_aten
from torch_ort.ortmodule.compositions import fsdp_managed, refusal
from torch_ort.ortmodule.variables import Settings, SkipCheck
from torch_ort.ortmodule.exporter import autocast_state
from torch_ort.ortmodule.fallback_policy import (
    FallbackManager,
    FallbackStatus,
    ORTModuleDeviceException,
    ORTModuleError,
    ORTModuleInitException,
    ORTModuleIOError,
)
from torch_ort.ortmodule.debug_options import LOGGER, DebugOptions
from torch_ort.ortmodule.module_proxy import ORIGINAL as _ORIGINAL
from torch_ort.ortmodule.module_proxy import ForwardAttribute, keys_without_wrapper, own_method
from torch_ort.ortmodule.plan_cache import PlanCache, describe
from torch_ort.ortmodule.runner import GraphRunner, input_schema
from torch_ort.ortmodule.translations.aten_op import qualified_name

if TYPE_CHECKING:
    from torch_ort.ortmodule.memory_report import MemoryReport

_RLOCK = type(threading.RLock())
_LOCK_TYPES = (type(threading.Lock()), _RLOCK)
_DEVICES = ("cpu", "cuda")
# Leaves an input may have besides tensors: values the export records as constants of the graph.
_INPUT_LEAVES = (torch.Tensor, int, float, bool, str, type(None), torch.dtype, torch.device,
                 torch.layout, torch.memory_format)


def _density(engine) -> float | None:
    """The last forward's label density (Engine.last_label_density), None where none was seen."""
    value = getattr(engine, "last_label_density", -1.0) if engine is not None else -1.0
    return None if value < 0 else value


class ORTModule(torch.nn.Module):
    """Wraps `module`; its parameters, buffers and state_dict keys stay the original's."""

    def __init__(self, module: torch.nn.Module, debug_options: DebugOptions | None = None):
        if isinstance(module, ORTModule):
            raise TypeError("the module is already an ORTModule")
        super().__init__()
        # A model type the engine does not take: raised under the fallback policy (construction,
        # then every call), as ORT does; FALLBACK_UNSUPPORTED_TORCH_MODEL runs it eager.
        self._refused = refusal(module)
        self._modules[_ORIGINAL] = module
        self._settings = Settings.from_env()  # every ORTMODULE_* variable; invalid values raise
        self._debug = debug_options or DebugOptions()
        self._debug.apply_log_level()
        self._fallback = FallbackManager(self._settings.fallback_policy, self._settings.fallback_retry)
        # Partial acceleration (partial.py): after a fallback that a split can help with, the
        # submodules that run in the engine while this module's forward runs eagerly.
        self._split: partial.Split | None = None
        self._splitting = False  # a copy rebuilds its split on its first eager call
        self._shared_exports: partial.SharedExports | None = None  # as a split's submodule
        # Serialises _prepare (runner lookup, export, engine build) and the plan cache; engines
        # run outside it, so several threads may run inference through one module at once.
        self._lock = threading.RLock()
        self._changed: set = set()   # attributes set since the last call (re-export pending)
        self._aten_fallback = AtenFallback(self._settings.aten_fallback)  # ops routed through ATenOp
        self._memory = memory_monitor.MemoryMonitor(self._settings)
        # (training, input schema, autocast state) -> GraphRunner, at most ORTMODULE_MAX_CACHED_GRAPHS
        self._plan_cache = PlanCache(self._settings.max_cached_graphs, self._memory.forget)
        self.export_count = 0      # how many times the module was exported (tests assert it)
        self.engine_build_count = 0  # engines compiled: exports x (inference, each requires-grad set)
        self.cache_hit_count = 0   # exports skipped because ORTMODULE_CACHE_DIR had the graph
        self._last_call = None     # inference_export.CallSchema of the last call (export_onnx)
        self._last_engine = None   # the engine of the last engine call (stats)
        self._last_runner = None   # its GraphRunner (stats: the memory plan)
        self.register_load_state_dict_pre_hook(keys_without_wrapper)
        self._initialized = True
        self._check_initialization()

    def _check_initialization(self) -> None:
        """What makes the engine unusable for this module from the start: a missing extension or
        parameters not yet materialised (lazy modules). FALLBACK_BAD_INITIALIZATION runs eager."""
        try:
            try:
                python_op.install()
            except ImportError as e:
                raise ORTModuleInitException(f"the torch_ort._C extension cannot be loaded: {e}") from e
            lazy = [n for n, p in self.module.named_parameters()
                    if isinstance(p, torch.nn.parameter.UninitializedParameter)]
            if lazy:
                raise ORTModuleInitException(
                    f"parameters {lazy[:3]} are not initialised yet (a lazy module); run one eager "
                    "forward before wrapping the module with ORTModule")
        except ORTModuleInitException as error:
            self._fallback.handle(error)
        if self._refused is not None and not self._fallback.active:
            self._fallback.handle(self._refused)
        if self._fallback.forced:
            self._fallback.warn_forced()

    # --- the original module shows through -------------------------------------------------
    @property
    def module(self) -> torch.nn.Module:
        return self._modules[_ORIGINAL]

    @property
    def fallback(self) -> FallbackStatus | None:
        """None while the engine runs the module; after a fallback to eager PyTorch (with
        ORTMODULE_FALLBACK_RETRY=1: until the engine runs a call again), a FallbackStatus naming
        the ORTMODULE_FALLBACK_POLICY flag, the reason and the failure's class — and, with partial
        acceleration, where each submodule runs (FallbackStatus.submodules) and the share of the
        parameters those in the engine hold (FallbackStatus.engine_parameter_share) and of the
        forward's FLOPs they spend (engine_flop_share)."""
        status = self._fallback.status
        if status is not None and self._split is not None:
            status = dataclasses.replace(status, submodules=tuple(self._split.statuses()),
                                         engine_parameter_share=self._split.engine_parameter_share(),
                                         engine_flop_share=self._split.engine_flop_share())
        return status

    def __repr__(self) -> str:
        # The wrapped module as it prints, inside ORTModule(...): not as a child named
        # _original_module (an implementation detail; state_dict keys do not show it either).
        inner = repr(self.module).replace("\n", "\n  ")
        return f"{type(self).__name__}(\n  {inner}\n)"

    def __getattr__(self, name):
        if "_modules" not in self.__dict__:  # half-built (unpickling, copy): nothing to forward to
            raise AttributeError(f"'ORTModule' object has no attribute {name!r}")
        try:
            return super().__getattr__(name)
        except AttributeError:
            pass
        module = self._modules[_ORIGINAL]
        value = getattr(module, name)
        if isinstance(value, types.MethodType) and value.__self__ is module:
            return types.MethodType(value.__func__, self._method_self())
        return value

    def _method_self(self):
        """What `self` is in a method of the wrapped module reached through the ORTModule
        (`model.generate(...)`, Lightning's `training_step`): the wrapped module as it is — an
        instance of its class sharing its attributes (super(), isinstance and properties work)
        — except that calling it, or its forward, runs the engine, and an attribute set through
        it is noted as one set on the ORTModule (re-export when an export read it)."""
        proxy = self.__dict__.get("_method_proxy")
        if proxy is None:
            module = self._modules[_ORIGINAL]
            owner = weakref.ref(self)

            def __call__(_, *args, **kwargs):
                return owner()(*args, **kwargs)

            def forward(_, *args, **kwargs):
                return owner()._forward_call(*args, **kwargs)

            def __setattr__(this, name, value):
                type(module).__setattr__(this, name, value)
                owner()._note_set(name, value)

            cls = type(module)
            try:
                proxy_cls = type(cls.__name__, (cls,), {
                    "__call__": __call__, "forward": forward, "__setattr__": __setattr__,
                    "__module__": cls.__module__, "__qualname__": cls.__qualname__})
                proxy = object.__new__(proxy_cls)
                object.__setattr__(proxy, "__dict__", module.__dict__)  # the same attributes
            except (TypeError, AttributeError) as e:  # a class that refuses subclasses or __dict__
                LOGGER.info("methods of %s reached through the ORTModule run bound to the ORTModule "
                            "(%s: %s)", cls.__name__, type(e).__name__, e)
                proxy = self
            self.__dict__["_method_proxy"] = proxy
        return proxy

    # --- copy, pickle, torch.save -----------------------------------------------------------------
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

    def _replicate_for_data_parallel(self):
        # torch.nn.DataParallel replicates modules per GPU; the engine's state is per module.
        raise TypeError("torch.nn.DataParallel around ORTModule is not supported; use "
                        "DistributedDataParallel(ORTModule(model)) instead")

    def __setattr__(self, name, value):
        """After construction, an attribute that is not ORTModule's own goes to the wrapped module
        and marks the model changed: the next call re-exports (and keeps the engines when the
        graph comes out the same). A value that is not a module or tensor, set on an attribute no
        export read, cannot change any graph: nothing happens. A name that is a method the wrapped
        module's class defines (not forward, not nn.Module's) is set on the ORTModule only, as
        ORTModule did: the wrapped module keeps its own method."""
        if "_initialized" not in self.__dict__ or name in self.__dict__ or name == "training" \
                or hasattr(type(self), name) or own_method(self.module, name):
            return super().__setattr__(name, value)
        setattr(self.module, name, value)
        self._note_set(name, value)

    def _note_set(self, name, value) -> None:
        """Attribute `name` of the wrapped module was set: the next call re-exports, unless the
        value cannot change any graph."""
        if not isinstance(value, (torch.nn.Module, torch.Tensor)) and self._unread(name):
            LOGGER.debug("attribute %r set: no exported graph read it, nothing to re-export", name)
            return
        self._changed.add(name)

    def _unread(self, name: str) -> bool:
        """True when no current export read attribute `name` of the module (so its value cannot
        change any graph). SKIP_CHECK_DISABLED re-exports on every assignment instead."""
        if self._settings.skipcheck & SkipCheck.SKIP_CHECK_DISABLED:
            return False
        with self._lock:
            reads = [r.export.attributes_read for r in self._plan_cache.runners()]
        # (A forward that reads self.__dict__[name] directly is not seen; nn.Module itself reads
        # __dict__ on every submodule access, so that read cannot count as reading everything.)
        return bool(reads) and all(r is not None and name not in r for r in reads)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        out = self.module.state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        meta = getattr(out, "_metadata", None)
        if prefix and meta is not None:
            # Inside a parent, whose load_state_dict walks _modules: its children look their
            # versions up under '<prefix>_original_module...' (see module_proxy.keys_without_wrapper).
            inner = prefix + _ORIGINAL
            for key in [k for k in meta if (k == prefix[:-1] or k.startswith(prefix)) and not k.startswith(inner)]:
                meta[inner + key[len(prefix) - 1:]] = meta[key]
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True,
                        assign: bool = False) -> Any:  # torch's _IncompatibleKeys
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    # Registering on the ORTModule registers on the wrapped module (whose state_dict, buffers and
    # parameters the ORTModule shows), and the next call re-exports, as for an attribute set.
    def register_buffer(self, name: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
        if "_initialized" not in self.__dict__:
            return super().register_buffer(name, tensor, persistent)
        self.module.register_buffer(name, tensor, persistent)
        self._changed.add(name)

    def register_parameter(self, name: str, param: torch.nn.Parameter | None) -> None:
        if "_initialized" not in self.__dict__:
            return super().register_parameter(name, param)
        self.module.register_parameter(name, param)
        self._changed.add(name)

    def add_module(self, name: str, module: torch.nn.Module | None) -> None:
        if "_initialized" not in self.__dict__:
            return super().add_module(name, module)
        self.module.add_module(name, module)
        self._changed.add(name)

    register_module = add_module

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, torch.nn.Parameter]]:
        return self.module.named_parameters(prefix, recurse, remove_duplicate)

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        return self.module.named_buffers(prefix, recurse, remove_duplicate)

    def named_modules(self, memo: set[torch.nn.Module] | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, torch.nn.Module]]:
        # children() is NOT delegated: train(), to() and apply() recurse through it and must
        # reach the wrapped module itself.
        if fsdp_managed(self):
            # fully_shard(ORTModule(block)): FSDP2 finds its states (the root's lazy init, which
            # sets up the shared communication context) by walking named_modules; this ORTModule
            # carries one, so it shows itself first.
            return self._with_self(memo, prefix, remove_duplicate)
        return self.module.named_modules(memo, prefix, remove_duplicate)

    def _with_self(self, memo, prefix, remove_duplicate):
        if memo is None:
            memo = set()
        if self not in memo or not remove_duplicate:
            if remove_duplicate:
                memo.add(self)
            yield prefix, self
        yield from self.module.named_modules(memo, prefix, remove_duplicate)

    def _fqn_modifiers(self) -> dict[str, str]:
        """torch.distributed.checkpoint's contract for a module whose state_dict keys skip a
        child: each key's first name here is reached through _original_module (so the names
        its get_/set_model_state_dict and optimizer state use are the original module's)."""
        module = self.module
        return dict.fromkeys([*module._parameters, *module._buffers, *module._modules], _ORIGINAL)

    # --- forward ------------------------------------------------------------------------------
    forward = ForwardAttribute()

    def _forward_call(self, *args: Any, **kwargs: Any) -> Any:
        if self._fallback.active:
            if self._splitting and self._split is None:
                self._split = partial.Split(self)
            return self._eager(self._split, args, kwargs)
        try:
            out = self._forward_engine(args, kwargs)
        except ORTModuleError as error:
            split = self._split_after(error)
            out = self._fallback.handle(error, lambda: self._eager(split, args, kwargs),
                                        split=split.describe if split is not None else None)
            self._split, self._splitting = split, split is not None  # kept once the fallback holds
            return out
        if self._fallback.status is not None:  # ORTMODULE_FALLBACK_RETRY: the engine runs again
            self._fallback.engine_ran()
        return out

    def _eager(self, split: partial.Split | None, args: tuple, kwargs: dict) -> Any:
        return self.module(*args, **kwargs) if split is None else split.run(args, kwargs)

    def _split_after(self, error: ORTModuleError) -> partial.Split | None:
        """The submodules to accelerate after `error` (None: the whole module runs eagerly)."""
        if self._split is not None:
            return self._split
        if not (self._settings.partial_acceleration and partial.splits(error)
                and self._fallback.covers(error)):
            return None
        split = partial.Split(self)
        return split if split.entries else None  # nothing to accelerate: the whole module eager

    def _apply_model_changes(self) -> None:
        """Attributes were set: every runner is re-exported on its next call and compared."""
        if not self._changed:
            return
        LOGGER.info("model changed (attribute %s set): re-exporting on the next call",
                    ", ".join(sorted(self._changed)))
        self._plan_cache.model_changed(frozenset(self._changed))
        self._changed.clear()

    def _check_devices(self, tensors, params) -> None:
        devices = {t.device for t in (*tensors, *params)}
        bad = [d for d in devices if d.type not in _DEVICES]
        if bad or len(devices) > 1:
            raise ORTModuleDeviceException(
                f"inputs and parameters are on {sorted(map(str, devices))}; the engine runs when all "
                f"are on one device of type {' or '.join(_DEVICES)}")

    def _device_types(self, tensors) -> set:
        """Where this call computes: its tensors' devices, else its parameters'."""
        return {t.device.type for t in tensors} or \
            {p.device.type for p in self.module.parameters()} or {"cpu"}

    def _count_export(self):
        self.export_count += 1

    def _count_cache_hit(self, n: int):
        self.cache_hit_count += n  # -1: the engine could not be built from the entry (exported)

    def _prepare(self, args, kwargs):
        """(runner, engine, tensors, params, training) for a call: exports and builds as needed,
        runs nothing. One thread at a time per module (self._lock): a schema exports once even
        when its first calls race."""
        with self._lock, progress.preparing(type(self.module).__name__, self._settings.progress), \
                partial.uncounted():
            return self._prepare_locked(args, kwargs)

    def _prepare_locked(self, args, kwargs):
        if self._refused is not None:
            raise self._refused
        self._apply_model_changes()
        kwargs = hf.adapt_call(self.module, args, kwargs, torch.is_grad_enabled())
        kwargs = dict(sorted(kwargs.items()))  # keyword order is not part of the schema
        flat, spec = pytree.tree_flatten((args, kwargs))
        self._last_call = inference_export.CallSchema(spec, flat)  # shapes only: for export_onnx(path)
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        for i, t in enumerate(tensors):
            if t.is_complex() or t.is_quantized or t.is_sparse:
                raise ORTModuleIOError(f"input tensor {i} has unsupported dtype/layout {t.dtype}/{t.layout}")
        odd = next((x for x in flat if not isinstance(x, _INPUT_LEAVES)), None)
        if odd is not None:
            raise ORTModuleIOError(
                f"an input of type {type(odd).__qualname__} is neither a tensor, a Python scalar or "
                "string, nor a container of them (tuple, list, dict, or a class registered with "
                "torch.utils._pytree or torch.export.register_dataclass); torch_ort cannot pass it "
                "to the graph")
        schema = input_schema(spec, flat)
        key = (self.module.training, schema, autocast_state(self._device_types(tensors)))
        runner = self._plan_cache.get(key)
        params = runner.params if runner is not None else None  # read once per call
        if runner is None or not runner.accepts(tensors, params):
            refused = refusal(self.module)  # fully_shard applied inside after construction
            if refused is not None:
                raise refused
            self._check_devices(tensors, self.module.parameters())
            plan = runner.export.shape_plan if runner is not None else "dynamic"
            if plan != "dynamic":
                LOGGER.info("inputs %s: the graph was exported with input dims %s, for other sizes "
                            "or parameter types; exporting again", describe(schema), plan)
            runner = GraphRunner(self.module, args, kwargs, self._debug, self._aten_fallback,
                                 on_export=self._count_export, settings=self._settings,
                                 schema=key, on_cache_hit=self._count_cache_hit, shape_plan=plan,
                                 shared=self._shared_exports)
            self._plan_cache.store(key, runner)
            params = runner.params
        elif not self._settings.skipcheck & SkipCheck.SKIP_CHECK_DEVICE or \
                self._settings.skipcheck & SkipCheck.SKIP_CHECK_DISABLED:
            self._check_devices(tensors, params)
        # Gradients are built whenever autograd would record the call (also in eval mode, where
        # ORT silently ran inference); otherwise the forward-only inference engine runs.
        training = torch.is_grad_enabled() and any(t.requires_grad for t in (*tensors, *params))
        built = runner.engines_built
        try:
            engine = runner.engine_for(training, tensors, args, kwargs, params)
        except BaseException:
            # A failed engine build leaves the runner as it was (the next call builds again), but
            # a failed ATen-fallback re-export leaves it without a graph: drop it (the next call
            # exports again, or raises the same error).
            if getattr(runner, "export", None) is None:
                self._plan_cache.discard(key, runner)
            raise
        if runner.engines_built != built:
            self.engine_build_count += runner.engines_built - built
            params = runner.params  # an ATen-fallback re-export may have rebound them
        return runner, engine, tensors, params, training

    def _forward_engine(self, args, kwargs):
        with partial.engine_running():  # a split counting its first call's FLOPs
            return self._run_engine(args, kwargs)

    def _run_engine(self, args, kwargs):
        runner, engine, tensors, params, training = self._prepare(args, kwargs)
        self._last_engine, self._last_runner = engine, runner
        report = self._memory.hook(engine, runner, tensors, training)
        if report:
            report("pre-forward")
        if training:
            plan = runner.release_plan(engine, len(tensors), params)
            outputs = bridge.run_training(engine, report, plan, tensors, params)
        else:
            with torch.no_grad(), python_op.errors_as_raised():
                outputs, _ = engine.forward([*tensors, *params])
        if report:
            report("post-forward")
        outputs = runner.restore_dropped(list(outputs), training)  # ORTMODULE_SKIP_LOGITS
        outputs = runner.buffer_updates.apply(outputs)  # running stats -> the module's buffers
        return runner.export.rebuild_outputs(outputs)

    # --- what happened ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """What this module did, for a user to check: `exports` and `engine_builds` (counts over
        its lifetime), `cache_hits` (exports ORTMODULE_CACHE_DIR saved), `host_reads_forward` and
        `host_reads_backward` — the device→host reads the engine made in the last forward and the
        last finished backward (each one makes a GPU step wait; counted on the CPU too, as if the
        values lived on a device; -1 before the first), `host_steps_forward` and
        `host_steps_backward` — the host steps (shape arithmetic) those calls ran, and
        `host_steps_cached_forward` / `host_steps_cached_backward` — those they took from the
        engine's per-input-shape cache instead (a steady step runs none; -1 before the first),
        `host_transfers` — the engine's ToHost nodes
        (reads per step) and ToDevice nodes (cached uploads), per phase — `cuda_graph_captures`
        and `cuda_graph_replays`, `label_sparsity` — whether the last engine computes its loss
        over the valid labels only (ORTMODULE_ENABLE_SPARSE_OPTIMIZER; its row count is one host
        read per forward), `label_density` — the share of labels that counted in the last
        forward's label sparsity (None when it did not run), `memory_plan` — the plan ORTMODULE_MEMORY_BUDGET chose for the last
        call's graph (runner.MemoryPlan: recompute level, LM-head chunk, predicted peak; None
        without a budget), `export_seconds` and `build_seconds` — what the last call's graph took to
        export (0 when ORTMODULE_CACHE_DIR had it) and its engine to build, `op_counts` — the
        executed graph's nodes per op (ours as "com.torch_ort::Op"), `aten_fallback_ops` — the
        operators routed through the ATen fallback, and `fallback`: None, or why the module runs in eager PyTorch
        and, under partial acceleration, which of its submodules run in the engine
        (ORTModule.fallback)."""
        engine = self._last_engine
        st = engine.stats() if engine is not None else {}
        graphs = getattr(engine, "cuda_graph_stats", None)
        graphs = graphs() if graphs is not None else {"captures": 0, "replays": 0}
        return {
            "exports": self.export_count,
            "engine_builds": self.engine_build_count,
            "cache_hits": self.cache_hit_count,
            "host_reads_forward": engine.last_host_reads_forward if engine is not None else -1,
            "host_reads_backward": engine.last_host_reads_backward if engine is not None else -1,
            **{f"host_steps{kind}_{phase}": getattr(engine, f"last_host_steps{kind}_{phase}", -1)
               for kind in ("", "_cached") for phase in ("forward", "backward")},
            "host_transfers": {k: st.get(k, 0) for k in ("to_host_forward", "to_host_backward",
                                                         "to_device_forward", "to_device_backward")},
            "cuda_graph_captures": graphs["captures"],
            "cuda_graph_replays": graphs["replays"],
            "label_sparsity": "label_sparsity" in st.get("passes_changed", ()),
            "label_density": _density(engine),
            "memory_plan": self._last_runner.memory_plan if self._last_runner is not None else None,
            "export_seconds": self._last_runner.export.seconds if self._last_runner is not None else 0.0,
            "build_seconds": self._last_runner.build_seconds if self._last_runner is not None else 0.0,
            "op_counts": dict(st.get("op_counts", {})),
            "aten_fallback_ops": sorted(qualified_name(op) for op in self._aten_fallback.reasons),
            "fallback": self.fallback,
        }

    # --- export for inference ------------------------------------------------------------------
    def export_onnx(self, path: str | os.PathLike, *args: Any, **kwargs: Any) -> str:
        """Writes the trained model's inference graph to `path` (ONNX: eval mode, the current
        weights included, every input dimension dynamic, standard ops only) for ONNX Runtime or
        any ONNX runtime; weights over 1 GiB go to '<path>.data' beside it. Example inputs are
        `args`/`kwargs`, or inputs shaped like the last call's. Returns `path`."""
        if not (args or kwargs):
            last = self._last_call
            if last is None:
                raise ValueError("export_onnx(path): the module has not been called yet; pass example "
                                 "inputs: export_onnx(path, *args, **kwargs)")
            args, kwargs = last.example()
        return inference_export.export_inference(self.module, args, kwargs, os.fspath(path),
                                            self._settings.opset)

    save_as_onnx = export_onnx  # the name some ONNX Runtime scripts use

    # --- memory -----------------------------------------------------------------------------
    def memory_report(self, *args: Any, **kwargs: Any) -> MemoryReport:
        """The memory report (torch_ort.ortmodule.memory_report.MemoryReport): the predicted peak of a
        training step for these inputs — known before the step runs: this exports and builds the
        training engine if needed, and runs nothing — the recompute opportunities and their state,
        and the measured peak once a step ran with inputs of these sizes. Without arguments: the
        report of the last training call."""
        if args or kwargs:
            with torch.enable_grad():
                runner, engine, tensors, params, training = self._prepare(args, kwargs)
            if not training:
                raise ValueError("memory_report: no input or parameter requires grad, so these "
                                 "inputs run the inference engine; the report covers training")
            return self._memory.report_of(engine, runner, [t.shape for t in tensors])
        if self._memory.last is None:
            raise ValueError("memory_report(): no training call yet; pass example inputs "
                             "(memory_report(*args, **kwargs)) to get the report before a step")
        return self._memory.report_of(*self._memory.last)
