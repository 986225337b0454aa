"""One exported graph (per module mode and input schema) and the engines built from it: a
training engine per set of requires-grad flags, and an inference engine."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from torch_ort import _compat
from torch_ort.ortmodule import bridge, cuda_graph, disk_cache, exporter, progress, python_op_export
from torch_ort.ortmodule.buffers import BufferUpdates
from torch_ort.ortmodule.aten_routing import (
    MAX_EXPORTS,
    AtenFallback,
    export_with_fallback,
    ops_from_engine_error,
    resolve_aten,
)
from torch_ort.ortmodule.variables import Settings
from torch_ort.ortmodule.exporter import exported_with_weights
from torch_ort.ortmodule.fallback_policy import ORTModuleONNXModelException
from torch_ort.ortmodule.debug_options import LOGGER, DebugOptions
from torch_ort.ortmodule.translations.aten_op import qualified_name


def input_schema(spec, flat) -> tuple:
    """What makes a call need a new export: the input structure, the non-tensor values, and each
    tensor's dtype, rank and device type. Sizes are not part of it (dims are symbolic)."""
    leaves = []
    for x in flat:
        if isinstance(x, torch.Tensor):
            leaves.append(("T", x.dtype, x.dim(), x.device.type))
        else:
            leaves.append((type(x).__name__, repr(x)))
    return (str(spec), tuple(leaves))


def _load_extension():
    try:
        from torch_ort import _C
    except ImportError as e:  # pragma: no cover - a broken install
        raise ImportError("torch_ort._C is not built; run `pip install -e . --no-build-isolation` "
                          f"(see README): {e}") from e
    return _C


_cuda_kernels_loaded = False


def _load_cuda_kernels() -> None:
    """Imports torch_ort._C_cuda once, which registers the CUDA versions of the engine's fused
    kernels with _C. Without it (built where nvcc was missing) those kernels run their unfused ATen
    reference on CUDA tensors: correct, slower; said once at INFO."""
    global _cuda_kernels_loaded
    if _cuda_kernels_loaded:
        return
    _cuda_kernels_loaded = True
    try:
        from torch_ort import _C_cuda  # noqa: F401  (importing registers the kernels)
    except ImportError as e:
        LOGGER.info("torch_ort._C_cuda is not built (%s): fused kernels run their unfused ATen "
                    "reference on CUDA", e)


def _slot(module: torch.nn.Module, fqn: str) -> tuple[dict, str]:
    """(the owning module's _parameters or _buffers dict, the local name) of a parameter/buffer."""
    owner_name, _, name = fqn.rpartition(".")
    owner = module.get_submodule(owner_name)
    return _compat.slot_table(owner, name), name


class MemoryBudgetError(ValueError):
    """ORTMODULE_MEMORY_BUDGET is below what any plan needs for a step of these inputs."""


# Logits bytes per chunk the budget planner tries for the fused LM head and loss, after its
# default (LinearCrossEntropy: one chunk × V of logits at a time).
_BUDGET_CHUNKS = (32 << 20, 8 << 20, 2 << 20)


def _gib(n: int) -> str:
    return f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.1f} MiB"


@dataclass(frozen=True)
class MemoryPlan:
    """The plan ORTMODULE_MEMORY_BUDGET chose (ORTModule.stats()['memory_plan'])."""
    budget: int          # bytes
    predicted: int       # the step's predicted peak, kernel chunks included
    memory_opt_level: int
    loss_chunk_bytes: int  # 0: the fused LM head's default chunk
    complete: bool       # False: some sizes are data (the valid-label rows), counted as 0

    def plan_text(self) -> str:
        chunk = "default" if self.loss_chunk_bytes == 0 else _gib(self.loss_chunk_bytes)
        return f"recompute level {self.memory_opt_level}, LM-head chunks {chunk}"

    def describe(self) -> str:
        tail = "" if self.complete else " (sizes that are data, such as the valid-label rows, not counted)"
        return (f"memory budget {_gib(self.budget)}: {self.plan_text()}; predicted step peak "
                f"{_gib(self.predicted)}{tail}")


class GraphRunner:
    """`aten` is the owner's ATen fallback set (shared by its runners); `on_export` is called once
    per export, re-exports for the ATen fallback included; `on_cache_hit(n)` with 1 when the export
    came from ORTMODULE_CACHE_DIR, -1 when that entry was then rejected (and exported instead).
    `shared` (partial.SharedExports): the exports of identical sibling submodules, in memory."""

    def __init__(self, module: torch.nn.Module, args: tuple, kwargs: dict, debug: DebugOptions,
                 aten: AtenFallback, on_export=lambda: None, settings: Settings | None = None,
                 schema=None, on_cache_hit=lambda n: None, shape_plan: str = "dynamic", shared=None):
        self._module, self._aten, self._on_export = module, aten, on_export
        self._shape_plan = shape_plan  # exporter.SHAPE_PLANS entry to start from
        self._on_cache_hit = on_cache_hit
        self._debug = debug
        self._settings = settings or Settings.from_env()
        self._schema = schema
        self.memory_plan: MemoryPlan | None = None  # ORTMODULE_MEMORY_BUDGET's choice
        self.engines_built = 0  # engines compiled, over all exports (ATen fallback rounds included)
        self.build_seconds = 0.0  # the last engine build's (a budget's trial builds included)
        self._cache_key = None  # ORTMODULE_CACHE_DIR entry this runner's export is stored under
        self._shared = shared
        self._shared_key = None  # its entry in `shared`
        self._export(args, kwargs)

    def _key(self) -> str:
        """The graph cache's key for this export ("" when it must not be reused: a hook in the
        module's tree runs inside the graph, and the key, which describes structure and not code,
        cannot tell two modules' hooks apart)."""
        hooked = _compat.hooked_module(self._module)
        if hooked is not None:
            where = {"": "the module", "*": "every module (a global hook)"}.get(hooked, f"submodule {hooked!r}")
            LOGGER.info("%s: a hook on %s is part of the graph: its export is neither cached nor "
                        "shared", type(self._module).__name__, where)
            return ""
        return disk_cache.cache_key(self._module, self._schema, self._settings.opset,
                                    [qualified_name(op) for op in self._aten.reasons])

    def _export(self, args: tuple, kwargs: dict) -> None:
        st = self._settings
        self.export = None
        if st.cache_dir and self._cache_key is None:
            self._cache_key = self._key()
            hit = disk_cache.load(st.cache_dir, self._cache_key, self._module) if self._cache_key else None
            if hit is not None:
                self.export, ops = hit
                self._on_cache_hit(1)
                self._add_aten(ops, "recorded in the export cache")
        if self.export is None and self._shared is not None and self._shared_key is None:
            self._shared_key = self._key()
            hit = self._shared.load(self._shared_key) if self._shared_key else None
            if hit is not None:
                self.export, ops = hit
                self._add_aten(ops, "an identical submodule's export runs it")
        if self.export is None:
            progress.stage("exporting")
            functions = python_op_export.FunctionPolicy(st.custom_autograd, st.allow_checkpoint,
                                                        st.skipped_functions,
                                                        strip_checkpoint=st.memory_opt_level >= 1)
            self.export = export_with_fallback(self._module, args, kwargs, st.opset, self._aten,
                                               self._on_export, functions, st.deepcopy_before_export,
                                               self._shape_plan)
            self._shape_plan = self.export.shape_plan
        self._slots = [_slot(self._module, n) for n in self.export.param_names]
        self._param_dtypes = [p.dtype for p in self.params]  # the graph's types for them
        self.buffer_updates = BufferUpdates(self._module, self.export.buffer_updates)  # trailing outputs
        self._engines: dict = {}
        self._release_plans: dict = {}  # (id(engine), number of user tensors) -> (engine, plan)

    def _add_aten(self, names: list[str], why: str) -> None:
        self._aten.add({op: why for op in filter(None, (resolve_aten(n.replace("::", ".")) for n in names))})

    @property
    def params(self) -> list:
        """The live parameters and buffers the graph's trailing inputs bind to (zero copy), read
        from their modules at every call: `module.to(...)` may replace Parameter objects."""
        return [table[name] for table, name in self._slots]

    def adopt_engines(self, old: "GraphRunner") -> None:
        """Engines of an identical graph (same bytes, same parameter names) stay valid: they bind
        parameters by position at every call."""
        self._engines = old._engines

    def accepts(self, tensors, params: list) -> bool:
        """False when the export fixed a size that this call's inputs do not have, or when the
        parameters (self.params, read once per call by the caller) changed dtype since
        (`module.to(torch.bfloat16)`)."""
        for t, dims in zip(tensors, self.export.static_dims):
            for size, fixed in zip(t.shape, dims):
                if fixed is not None and size != fixed:
                    return False
        return [p.dtype for p in params] == self._param_dtypes

    def engine_for(self, training: bool, tensors, args: tuple, kwargs: dict, params: list):
        """The engine for this call (`params`: self.params as read by the caller); an engine build
        that names ops we cannot run re-exports with them on the ATen fallback (self.params may
        then be rebound: read it again after this call when engines_built changed)."""
        for attempt in range(MAX_EXPORTS):
            if attempt:
                params = self.params
            flags = tuple(t.requires_grad for t in (*tensors, *params)) if training else None
            engine = self._engines.get((training, flags))
            if engine is None:
                n_inputs = len(tensors) + len(params)
                try:
                    sizes = [list(t.shape) for t in (*tensors, *params)]
                    engine = self._build(training, list(flags) if flags else [False] * n_inputs, sizes)
                except Exception as e:
                    if self.export.shared:  # a sibling's graph: this module exports its own
                        self._shared.drop(self._shared_key)
                        self._export(args, kwargs)
                        continue
                    if not self.export.from_cache:
                        raise
                    # A graph read from ORTMODULE_CACHE_DIR is never trusted over an export.
                    disk_cache.drop(self._settings.cache_dir, self._cache_key, f"{type(e).__name__}: {e}")
                    self._on_cache_hit(-1)
                    self._export(args, kwargs)
                    continue
            if engine is not None:
                self._engines[(training, flags)] = engine
                self._store_in_cache()
                return engine
            self._export(args, kwargs)
        raise ORTModuleONNXModelException(f"ATen fallback: the engine still fails after {MAX_EXPORTS} "
                                          "re-exports")

    def release_plan(self, engine, num_tensors: int, params: list):
        """How this training engine's backward hands gradients to PyTorch (bridge.ReleasePlan),
        made once per engine and number of user tensors (parameter sizes are the export's)."""
        key = (id(engine), num_tensors)
        hit = self._release_plans.get(key)
        if hit is None or hit[0] is not engine:
            min_bytes = int(self._settings.gradient_release_mb * 2 ** 20)
            hit = (engine, bridge.ReleasePlan.build(engine, num_tensors, params, min_bytes))
            self._release_plans[key] = hit
        return hit[1]

    def _store_in_cache(self) -> None:
        """Writes the export once an engine has been built from it (the ATen fallback set is then
        final) and unless it came from the cache."""
        if self.export.from_cache or self.export.shared or self.export.stored:
            return
        ops = [qualified_name(op) for op in self._aten.reasons]
        if self._cache_key:
            disk_cache.store(self._settings.cache_dir, self._cache_key, self.export, ops)
        if self._shared_key:
            self._shared.store(self._shared_key, self.export, ops)
        self.export.stored = True

    def _label_sparsity(self) -> bool:
        """Whether the loss runs over valid labels only (ORTMODULE_ENABLE_SPARSE_OPTIMIZER): never
        under CUDA graphs (the row count is data), on CUDA only when asked (a host wait per step)."""
        st = self._settings
        if not st.compute_optimizer or st.sparse_optimizer is False:
            return False
        on_cuda = any(p.is_cuda for p in self.params)
        if on_cuda and st.use_cuda_graph:
            return False
        return st.sparse_optimizer is True or not on_cuda

    def dropped_outputs(self, training: bool) -> list[int]:
        """Graph outputs a training engine does not compute: under ORTMODULE_SKIP_LOGITS, the
        `logits` a model returns beside a computed `loss` (each call then gets logits=None)."""
        if not training or not self._settings.skip_logits:
            return []
        at = self.export.logits_output
        return [] if at is None else [at]

    def restore_dropped(self, outputs: list, training: bool) -> list:
        """The engine's outputs with None where dropped_outputs left one out."""
        for at in self.dropped_outputs(training):
            outputs.insert(at, None)
        return outputs

    def _disabled_passes(self) -> list[str]:
        disabled = set(self._settings.disabled_passes)
        if not self._settings.efficient_attention:
            disabled.add("attention_fusion")
        if not self._label_sparsity():
            disabled.add("label_sparsity")
        known = set(_load_extension().pass_names())
        return sorted(disabled & known)

    def _within_budget(self, engine, compile_with, sizes):
        """ORTMODULE_MEMORY_BUDGET: the cheapest plan whose predicted step peak (the memory
        report's, plus the kernels' own chunks) fits, in order: as configured, 32 MiB chunks of
        the fused LM head and loss, then recompute levels 1 and 2 (each with both), then smaller
        chunks at the highest level. Raises MemoryBudgetError naming the smallest budget any plan
        needs when none fits."""
        budget, level0 = self._settings.memory_budget, self._settings.memory_opt_level
        fused = engine.stats()["kernel_workspace_bytes"] > 0  # a LinearCrossEntropy to chunk
        levels = sorted({level0, 1, 2} - set(range(level0)))
        # Cheapest first: a 32 MiB chunk costs little (dW is re-read once per chunk), recompute
        # costs a forward's worth per layer; the small chunks come last.
        plans = [(level, chunk) for level in levels for chunk in (0, _BUDGET_CHUNKS[0])]
        plans += [(levels[-1], chunk) for chunk in _BUDGET_CHUNKS[1:]]
        if not fused:
            plans = [(level, 0) for level in levels]
        smallest = None
        for level, chunk in plans:
            if (level, chunk) != (level0, 0):
                engine = compile_with(level, chunk)
            predicted = engine.memory_report(sizes)["predicted"]
            need = predicted["peak"] + engine.stats()["kernel_workspace_bytes"]
            plan = MemoryPlan(budget, need, level, chunk, predicted["complete"])
            if need <= budget:
                LOGGER.info("%s", plan.describe())
                self.memory_plan = plan
                return engine
            if smallest is None or need < smallest.predicted:
                smallest = plan
        raise MemoryBudgetError(
            f"ORTMODULE_MEMORY_BUDGET={_gib(budget)}: no plan fits a step of inputs sized "
            f"{sizes[:len(sizes) - len(self.params)]}; the smallest predicted "
            f"step peak is {_gib(smallest.predicted)} ({smallest.plan_text()}): set a budget of at "
            f"least {_gib(smallest.predicted)}, or smaller inputs")

    def _fewer_dynamic_dims(self, error: BaseException) -> str | None:
        """The next exporter.SHAPE_PLANS entry when shape inference proved the export's declared
        shapes wrong for some sizes (torch traced x.squeeze(1) of a symbolic dim as a no-op that
        ONNX's Squeeze is not), else None."""
        plans = exporter.SHAPE_PLANS
        at = plans.index(self.export.shape_plan)
        if not str(error).startswith("shape inference:") or at + 1 == len(plans):
            return None
        return plans[at + 1]

    def _build(self, training: bool, flags: list[bool], sizes: list[list[int]] | None = None):
        """The engine, or None when the ATen fallback took new ops (export again). `sizes`: the
        call's input sizes, parameters included (ORTMODULE_MEMORY_BUDGET plans for them)."""
        _C = _load_extension()
        if any(p.is_cuda for p in self.params):
            _load_cuda_kernels()
        start = time.perf_counter()
        progress.stage(f"building the {'training' if training else 'inference'} engine")
        st = self._settings
        recompute = [(p.cluster, p.strategy, p.count) for p in st.memory_opt_config]

        def compile_with(level: int, chunk_bytes: int):
            return _C.Engine(self.export.onnx_bytes, training, flags, self._disabled_passes(),
                             level if training else 0, recompute if training else [],
                             self.dropped_outputs(training), chunk_bytes)
        try:
            # An unknown recompute cluster raises ValueError (listing the valid ids): a user error,
            # never a fallback.
            engine = compile_with(st.memory_opt_level, 0)
            if training and st.memory_budget is not None and sizes is not None:
                engine = self._within_budget(engine, compile_with, sizes)
        except (_C.GradientError, _C.UnsupportedOpError) as e:
            if self._aten.add(ops_from_engine_error(self.export, e)):
                return None
            raise ORTModuleONNXModelException(f"{type(e).__name__}: {e}") from e
        except (_C.OnnxImportError, _C.VerifyError) as e:
            following = self._fewer_dynamic_dims(e)
            if following:
                LOGGER.info("%s: the exported graph holds only for some sizes of its symbolic "
                            "dims (%s); exporting again with input dims %s",
                            type(self._module).__name__, e, following)
                self._shape_plan = following
                return None
            raise ORTModuleONNXModelException(f"{type(e).__name__}: {e}") from e
        self.engines_built += 1
        self.build_seconds = time.perf_counter() - start
        stats = engine.stats()
        if training:
            LOGGER.info("training graph: %d forward nodes, %d backward nodes (%d recomputed); saved "
                        "set: %d of %d forward values kept for backward (plus %d graph inputs)",
                        stats["num_forward_nodes"], stats["num_backward_nodes"],
                        stats["recompute_nodes"], stats["num_saved_activations"],
                        stats["num_forward_values"], stats["num_saved"] - stats["num_saved_activations"])
        else:
            LOGGER.info("inference graph: %d nodes", stats["num_forward_nodes"])
        if self._debug.save_onnx:
            self._save(engine, training)
        if st.use_cuda_graph:  # replays steady-state calls on CUDA (its own module doc)
            engine = cuda_graph.GraphedEngine(engine, len(self.export.input_names))
        return engine

    def _save(self, engine, training: bool) -> None:
        """DebugOptions(save_onnx=True): each stage under ONNX Runtime's file name for that stage,
        `{prefix}_{stage}_{mode}.onnx`, mode `training` for an engine with gradients (ORT's training
        manager) and `inference` for a forward-only one, so neither overwrites the other. Training
        engines write torch_exported (the exporter's graph), optimized_pre_grad (the forward after
        our passes, before autodiff) and execution_model (forward+backward as the engine runs it:
        recompute and host placement applied); inference engines write torch_exported and
        execution_model (the forward that runs). ORT's post_processed and optimized stages have no
        graph of their own here (docs/migration.md)."""
        directory = self._debug.save_dir
        base = os.path.join(directory, self._debug.onnx_prefix)
        os.makedirs(directory, exist_ok=True)
        exported = (exported_with_weights(self.export) if self.export.raw_model is not None
                    else self.export.onnx_bytes)  # from the cache: weights stay graph inputs
        stages = {"torch_exported": lambda: exported}
        if training:
            stages["optimized_pre_grad"] = engine.forward_graph_onnx
            stages["execution_model"] = engine.training_graph_onnx
        else:
            stages["execution_model"] = engine.forward_graph_onnx
        mode = "training" if training else "inference"
        for stage, graph in stages.items():
            path = f"{base}_{stage}_{mode}.onnx"
            with open(path, "wb") as f:
                f.write(graph())
            LOGGER.info("saved %s", path)
