"""One exported graph (per module mode and input schema) and the engines built from it: a
training engine per set of requires-grad flags, and an inference engine."""
from __future__ import annotations

import time
import enum

import torch

from torch_ort import _compat
from torch_ort.ortmodule.engine import bridge, cuda_graph, decision_variants, memory_budget, progress
from torch_ort.ortmodule.engine.memory_budget import MemoryPlan
from torch_ort.ortmodule.engine.save_onnx import save_onnx_stages
from torch_ort.ortmodule.export import disk_cache, python_op_export, shape_plans
from torch_ort.ortmodule.export.buffers import BufferUpdates
from torch_ort.ortmodule.export.aten_routing import (
    MAX_EXPORTS,
    AtenFallback,
    export_with_fallback,
    ops_from_engine_error,
    resolve_aten,
)
from torch_ort.ortmodule.policy.variables import Settings
from torch_ort.ortmodule.policy.fallback_policy import ORTModuleONNXModelException
from torch_ort.ortmodule.policy.debug_options import LOGGER, DebugOptions
from torch_ort.ortmodule.export.translations.aten_op import qualified_name


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


class Reason(enum.Enum):
    """Why a runner exports its module again instead of building an engine (engine_for)."""
    ATEN_OPS = "the engine named ops to run through the ATen fallback"
    FEWER_DYNAMIC_DIMS = "shape inference proved the graph right for some sizes of its symbolic dims only"
    SHARED_GRAPH = "the graph of an identical sibling submodule did not build for this one"
    CACHED_GRAPH = "the graph read from ORTMODULE_CACHE_DIR did not build"


class ExportAgain(Exception):
    """Raised by an engine build that a new export can fix; engine_for exports and builds again."""

    def __init__(self, reason: Reason, detail: str):
        super().__init__(f"{reason.value} ({detail})")
        self.reason = reason


def label_sparsity_on(st, on_cuda: bool) -> bool:
    """Whether the loss runs over valid labels only (ORTMODULE_ENABLE_SPARSE_OPTIMIZER): never
    under CUDA graphs (the row count is data), on CUDA only when asked (a host wait per step)."""
    if not st.compute_optimizer or st.sparse_optimizer is False:
        return False
    if on_cuda and st.use_cuda_graph:
        return False
    return st.sparse_optimizer is True or not on_cuda


def padding_elimination_on(st, on_cuda: bool) -> bool:
    """Whether token-wise work runs on the unpadded rows only
    (ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER): off by default, never under CUDA graphs."""
    if not st.compute_optimizer or not st.embedding_sparse_optimizer:
        return False
    return not (on_cuda and st.use_cuda_graph)


class GraphRunner:
    """`aten` is the owner's ATen fallback set (shared by its runners); `on_export` is called once
    per export, re-exports for the ATen fallback included; `on_cache_hit(n)` with 1 when the export
    came from ORTMODULE_CACHE_DIR, -1 when that entry was then rejected (and exported instead).
    `shared` (partial.SharedExports): the exports of identical sibling submodules, in memory."""

    def __init__(self, module: torch.nn.Module, args: tuple, kwargs: dict, debug: DebugOptions,
                 aten: AtenFallback, on_export=lambda: None, settings: Settings | None = None,
                 schema=None, on_cache_hit=lambda n: None, shape_plan: str = "dynamic", shared=None):
        self._module, self._aten, self._on_export = module, aten, on_export
        self._shape_plan = shape_plan  # shape_plans.SHAPE_PLANS entry to start from
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
        self.variants = decision_variants.Variants()  # graphs for other outcomes of its decisions
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
                                    [qualified_name(op) for op in self._aten.reasons],
                                    (*disk_cache.export_options(self._settings), self._shape_plan))

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
                                               self._shape_plan, st.decisions_from_values)
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
        """The engine for this call (`params`: self.params as read by the caller). A build that a
        new export can fix (ExportAgain, for a Reason) exports again, at most MAX_EXPORTS times;
        self.params may then be rebound: read it again after this call when engines_built changed."""
        for attempt in range(MAX_EXPORTS):
            if attempt:
                params = self.params
            flags = tuple(t.requires_grad for t in (*tensors, *params)) if training else None
            engine = self._engines.get((training, flags))
            if engine is None:
                try:
                    engine = self._build_own(training, flags, tensors, params)
                except ExportAgain as again:
                    LOGGER.info("%s: exporting again: %s", type(self._module).__name__, again)
                    self._export(args, kwargs)
                    continue
                self._engines[(training, flags)] = engine
            self._store_in_cache()
            return engine
        raise ORTModuleONNXModelException(f"ATen fallback: the engine still fails after {MAX_EXPORTS} "
                                          "re-exports")

    def _build_own(self, training: bool, flags: tuple | None, tensors, params: list):
        """_build, where a graph this module did not export itself (a sibling's, or one read from
        ORTMODULE_CACHE_DIR) is never trusted over an export: its failure is ExportAgain."""
        n_inputs = len(tensors) + len(params)
        sizes = [list(t.shape) for t in (*tensors, *params)]
        try:
            return self._build(training, list(flags) if flags else [False] * n_inputs, sizes)
        except ExportAgain:
            raise
        except Exception as e:
            if self.export.shared:
                self._shared.drop(self._shared_key)
                raise ExportAgain(Reason.SHARED_GRAPH, f"{type(e).__name__}: {e}") from e
            if not self.export.from_cache:
                raise
            disk_cache.drop(self._settings.cache_dir, self._cache_key, f"{type(e).__name__}: {e}")
            self._on_cache_hit(-1)
            raise ExportAgain(Reason.CACHED_GRAPH, f"{type(e).__name__}: {e}") from e

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
        on_cuda = any(p.is_cuda for p in self.params)
        if not label_sparsity_on(self._settings, on_cuda):
            disabled.add("label_sparsity")
        if not padding_elimination_on(self._settings, on_cuda):
            disabled.add("padding_elimination")
        known = set(_load_extension().pass_names())
        return sorted(disabled & known)

    def _fewer_dynamic_dims(self) -> str | None:
        """The shape_plans.SHAPE_PLANS entry after the export's, None after the last: for a graph
        shape inference proved wrong for some sizes (torch traced x.squeeze(1) of a symbolic dim
        as a no-op that ONNX's Squeeze is not)."""
        plans = shape_plans.SHAPE_PLANS
        at = plans.index(self.export.shape_plan)
        return None if at + 1 == len(plans) else plans[at + 1]

    def _build(self, training: bool, flags: list[bool], sizes: list[list[int]] | None = None):
        """The engine; ExportAgain when a new export can fix the build (the ATen fallback took new
        ops, or shape inference asks for fewer dynamic dims). `sizes`: the call's input sizes,
        parameters included (ORTMODULE_MEMORY_BUDGET plans for them)."""
        _C = _load_extension()
        if any(p.is_cuda for p in self.params):
            _load_cuda_kernels()
        _C.set_cpu_buffer_pool(self._settings.cpu_buffer_pool)  # process-wide: the last build's setting
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
                engine, self.memory_plan = memory_budget.within_budget(
                    engine, compile_with, sizes[:len(sizes) - len(self.params)], sizes, st)
        except (_C.GradientError, _C.UnsupportedOpError) as e:
            if self._aten.add(ops_from_engine_error(self.export, e)):
                raise ExportAgain(Reason.ATEN_OPS, ", ".join(sorted(map(qualified_name, self._aten.reasons))))
            raise ORTModuleONNXModelException(f"{type(e).__name__}: {e}") from e
        except _C.ShapeInferenceError as e:
            following = self._fewer_dynamic_dims()
            if following is None:
                raise ORTModuleONNXModelException(f"{type(e).__name__}: {e}") from e
            self._shape_plan = following
            raise ExportAgain(Reason.FEWER_DYNAMIC_DIMS, f"{e}; input dims {following}") from e
        except (_C.OnnxImportError, _C.VerifyError) as e:
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
            save_onnx_stages(self._debug, self.export, engine, training)
        if st.use_cuda_graph:  # replays steady-state calls on CUDA (its own module doc)
            engine = cuda_graph.GraphedEngine(engine, len(self.export.input_names))
        return engine
