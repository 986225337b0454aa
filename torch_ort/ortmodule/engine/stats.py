"""ORTModule.stats(): what a module did, for a user to check."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch_ort.ortmodule.export.translations.aten_op import qualified_name

if TYPE_CHECKING:
    from torch_ort.ortmodule.ortmodule import ORTModule


def _density(engine, name: str = "last_label_density") -> float | None:
    """The last forward's label density (Engine.last_label_density) or row density
    (Engine.last_row_density), None where none was seen."""
    value = getattr(engine, name, -1.0) if engine is not None else -1.0
    return None if value < 0 else value


def module_stats(m: "ORTModule") -> dict[str, Any]:
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
    forward's label sparsity (None when it did not run), `padding_elimination` — whether the
    last engine runs its token-wise work on the unpadded rows only
    (ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER; two host reads per forward: the row count and
    the attention mask's check), `row_density` — the share of (batch, sequence) rows it kept in
    the last forward (None when it did not run), `decisions` — the data-dependent decisions the
    last graph took from values and checks on every call (export/decisions.py), `decision_flips`
    — how often a call's values flipped one (each runs on a graph for its own outcome), `memory_plan` — the plan ORTMODULE_MEMORY_BUDGET chose for the last
    call's graph (memory_budget.MemoryPlan: recompute level, LM-head chunk, predicted peak; None
    without a budget), `export_seconds` and `build_seconds` — what the last call's graph took to
    export (0 when ORTMODULE_CACHE_DIR had it) and its engine to build, `op_counts` — the
    executed graph's nodes per op (ours as "com.torch_ort::Op"), `aten_fallback_ops` — the
    operators routed through the ATen fallback, and `fallback`: None, or why the module runs in eager PyTorch
    and, under partial acceleration, which of its submodules run in the engine
    (ORTModule.fallback)."""
    from torch_ort import _C  # on first use: a broken build fails there, naming the problem
    engine = m._last_engine
    st = engine.stats() if engine is not None else {}
    graphs = getattr(engine, "cuda_graph_stats", None)
    graphs = graphs() if graphs is not None else {"captures": 0, "replays": 0}
    return {
        "exports": m.export_count,
        "engine_builds": m.engine_build_count,
        "cache_hits": m.cache_hit_count,
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
        "padding_elimination": "padding_elimination" in st.get("passes_changed", ()),
        "row_density": _density(engine, "last_row_density"),
        "decisions": m._last_runner.export.decisions if m._last_runner is not None else 0,
        "decision_flips": m._last_runner.variants.flips if m._last_runner is not None else 0,
        "memory_plan": m._last_runner.memory_plan if m._last_runner is not None else None,
        "export_seconds": m._last_runner.export.seconds if m._last_runner is not None else 0.0,
        "build_seconds": m._last_runner.build_seconds if m._last_runner is not None else 0.0,
        "op_counts": dict(st.get("op_counts", {})),
        "cpu_buffer_pool": _C.cpu_buffer_pool(),
        "aten_fallback_ops": sorted(qualified_name(op) for op in m._aten_fallback.reasons),
        "fallback": m.fallback,
    }
