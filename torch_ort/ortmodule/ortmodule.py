"""ORTModule: a drop-in nn.Module whose forward and backward run through the torch_ort engine.
How it stands in for the wrapped module is module_proxy.ModuleProxy; how it is copied,
copying.Copyable; what a call's inputs are, call_schema."""
from __future__ import annotations

import dataclasses
import os
import threading
from typing import TYPE_CHECKING, Any

import torch

from torch_ort.ortmodule.call_schema import check_devices, device_types, parse_call
from torch_ort.ortmodule.copying import Copyable
from torch_ort.ortmodule.engine import bridge, decision_variants, memory_monitor, progress
from torch_ort.ortmodule.engine.plan_cache import PlanCache, describe
from torch_ort.ortmodule.engine.runner import GraphRunner
from torch_ort.ortmodule.engine.stats import module_stats
from torch_ort.ortmodule.export import inference_export, python_op
from torch_ort.ortmodule.export.aten_routing import AtenFallback
from torch_ort.ortmodule.export.autocast import autocast_state
from torch_ort.ortmodule.policy.compositions import refusal
from torch_ort.ortmodule.module_proxy import ORIGINAL, ForwardAttribute, ModuleProxy, keys_without_wrapper
from torch_ort.ortmodule.policy import partial
from torch_ort.ortmodule.policy.debug_options import LOGGER, DebugOptions
from torch_ort.ortmodule.policy.fallback_policy import (
    FallbackManager,
    FallbackStatus,
    ORTModuleError,
    ORTModuleInitException,
)
from torch_ort.ortmodule.policy.variables import Settings, SkipCheck

if TYPE_CHECKING:
    from torch_ort.ortmodule.engine.memory_report import MemoryReport

class ORTModule(ModuleProxy, Copyable):
    """Wraps `module`; its parameters, buffers and state_dict keys stay the original's."""

    def __init__(self, module: torch.nn.Module, debug_options: DebugOptions | None = None):
        if isinstance(module, ORTModule):
            raise TypeError("the module is already an ORTModule")
        super().__init__()
        # A model type the engine does not take: raised under the fallback policy (construction,
        # then every call), as ORT does; FALLBACK_UNSUPPORTED_TORCH_MODEL runs it eager.
        self._refused = refusal(module)
        self._modules[ORIGINAL] = module
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

    # --- forward ------------------------------------------------------------------------------
    forward = ForwardAttribute()

    def _forward_call(self, *args: Any, **kwargs: Any) -> Any:
        if self._fallback.active:
            if self._splitting and self._split is None:
                self._split = partial.Split(self, ORTModule)
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
        split = partial.Split(self, ORTModule)
        return split if split.entries else None  # nothing to accelerate: the whole module eager

    def _apply_model_changes(self) -> None:
        """Attributes were set: every runner is re-exported on its next call and compared."""
        if not self._changed:
            return
        LOGGER.info("model changed (attribute %s set): re-exporting on the next call",
                    ", ".join(sorted(self._changed)))
        self._plan_cache.model_changed(frozenset(self._changed))
        self._changed.clear()

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
        call = parse_call(self.module, args, kwargs)
        kwargs, tensors, schema = call.kwargs, call.tensors, call.schema
        self._last_call = inference_export.CallSchema(call.spec, call.flat)  # for export_onnx(path)
        key = (self.module.training, schema, autocast_state(device_types(tensors, self.module)))
        runner = self._plan_cache.get(key)
        params = runner.params if runner is not None else None  # read once per call
        if runner is None or not runner.accepts(tensors, params):
            refused = refusal(self.module)  # fully_shard applied inside after construction
            if refused is not None:
                raise refused
            check_devices(tensors, self.module.parameters())
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
            check_devices(tensors, params)
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
        partial.refuse_outputs_recorded_outside(self.module)
        with partial.engine_running():  # a split counting its first call's FLOPs
            return self._run_engine(args, kwargs)

    def _run_engine(self, args, kwargs, tried: frozenset = frozenset(), fresh: bool = False):
        runner, engine, tensors, params, training = self._prepare(args, kwargs)
        self._last_engine, self._last_runner = engine, runner
        report = self._memory.hook(engine, runner, tensors, training)
        if report:
            report("pre-forward")
        try:
            if training:
                plan = runner.release_plan(engine, len(tensors), params)
                outputs = bridge.run_training(engine, report, plan, tensors, params)
            else:
                with torch.no_grad(), python_op.errors_as_raised():
                    outputs, _ = engine.forward([*tensors, *params])
        except Exception as e:  # a decision the export took from values does not hold: other graph
            # (a kernel error in a graph exported for this very call is the model's own)
            if not decision_variants.changed(e) and not (not fresh and decision_variants.may_have_changed(runner, e)):
                raise
            if fresh:  # the graph exported for this very call: its export and its run disagree
                raise decision_variants.disagreement(runner, e) from e
            tried = tried | {id(runner.export)}
            fresh = runner.variants.switch(runner, e, args, kwargs, tried)
            return self._run_engine(args, kwargs, tried, fresh)
        if report:
            report("post-forward")
        outputs = runner.restore_dropped(list(outputs), training)  # ORTMODULE_SKIP_LOGITS
        outputs = runner.buffer_updates.apply(outputs)  # running stats -> the module's buffers
        return runner.export.rebuild_outputs(outputs)

    # --- what happened ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return module_stats(self)

    stats.__doc__ = module_stats.__doc__

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
        """The memory report (torch_ort.ortmodule.engine.memory_report.MemoryReport): the predicted peak of a
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
