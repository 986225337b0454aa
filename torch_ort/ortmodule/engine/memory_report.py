"""The memory report: the engine's static peak estimate for a call's input sizes, the recompute
opportunities of ORTMODULE_MEMORY_OPT_LEVEL / ORTMODULE_MEMORY_OPT_CONFIG with their on/off state,
and, once a step ran with those sizes, the peak the engine measured.

Byte counts are activation bytes: what the engine allocates during a step (forward values, the
saved set, backward values, the parameter gradients it returns). Parameters, inputs, optimizer
state and the caller's own tensors are not in them; constants are listed apart.
"""
from __future__ import annotations

from dataclasses import dataclass, field


def _mib(n: int) -> str:
    if n is None or n < 0:
        return "?"
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 17 else f"{n / 1024:.1f} KiB"


@dataclass(frozen=True)
class RecomputeRow:
    """One recompute opportunity: a cluster of identical forward subgraphs (ORT's ids)."""

    cluster: str              # "FusedMatMul+BiasGelu+"
    strategy: int             # 1 recompute, 2 recompute with compromise
    occurrences: int          # how many activations match (e.g. one per transformer layer)
    enabled: int              # how many of them are recomputed
    bytes_saved_each: int     # for this report's input sizes (-1: a size was unknown)
    bytes_saved_formula: str  # in the input dims: "4*input_ids_dim0*input_ids_dim1*1536"
    layers: tuple = ()        # layer (residual branch) of each occurrence; -1: outside every layer

    @property
    def bytes_saved(self) -> int:
        """Bytes the enabled occurrences save."""
        return self.enabled * max(self.bytes_saved_each, 0)

    @property
    def config(self) -> str:
        """The ORTMODULE_MEMORY_OPT_CONFIG entry that turns every occurrence on."""
        return f"{self.cluster}:{self.strategy}:-1"


@dataclass
class MemoryReport:
    """`ORTModule.memory_report(...)`. predicted: forward_peak, saved, outputs, backward_peak,
    peak (= max(forward_peak, outputs + backward_peak): the caller holds the outputs through
    backward), peak_outputs_released (= max(forward_peak, backward_peak): a loop that keeps only
    the loss), constants, in bytes, and the formulas of
    the forward peak, the saved set and the backward peak. measured: the same keys measured during
    the last step with these input sizes (None before one ran)."""

    input_sizes: dict
    predicted: dict
    rows: list = field(default_factory=list)
    level: int = 0
    config: str = ""
    num_layers: int = 0       # residual branches found (two per pre-LN transformer block)
    nodes_cloned: int = 0
    unknown_values: list = field(default_factory=list)
    measured: dict | None = None

    @classmethod
    def from_engine(cls, data: dict, input_sizes: dict, level: int, config: str,
                    measured: dict | None) -> "MemoryReport":
        predicted, measured = dict(data["predicted"]), dict(measured) if measured else None
        for d in (predicted, measured or {}):
            if "forward_peak" in d:
                d["peak_outputs_released"] = max(d["forward_peak"], d["backward_peak"])
        rows = [RecomputeRow(r["cluster"], r["strategy"], r["occurrences"], r["enabled"],
                             r["bytes_saved_each"], r["bytes_saved_formula"], tuple(r["layers"]))
                for r in data["rows"]]
        return cls(input_sizes, predicted, rows, level, config, data["num_layers"],
                   data["nodes_cloned"], list(data["unknown_values"]), measured)

    @property
    def bytes_saved(self) -> int:
        return sum(r.bytes_saved for r in self.rows)

    def table(self) -> str:
        p = self.predicted
        sizes = ", ".join(f"{k} {list(v)}" for k, v in self.input_sizes.items())
        lines = [f"Memory report (ORTMODULE_MEMORY_OPT_LEVEL={self.level}"
                 + (f", ORTMODULE_MEMORY_OPT_CONFIG={self.config}" if self.config else "")
                 + f"; {self.num_layers} layers (residual branches) detected; {self.nodes_cloned} nodes "
                 f"recomputed in backward) for inputs {sizes}"]
        if self.rows:
            width = max(28, *(len(r.cluster) for r in self.rows))
            lines.append(f"  {'cluster':<{width}} strategy  occurs  on  {'saved each':>10}  "
                         f"{'saved (on)':>10}  saved each, in the input dims")
            for r in self.rows:
                lines.append(f"  {r.cluster:<{width}} {r.strategy:>8}  {r.occurrences:>6}  "
                             f"{r.enabled:>2}  {_mib(r.bytes_saved_each):>10}  "
                             f"{_mib(r.bytes_saved):>10}  {r.bytes_saved_formula}")
            lines.append("  turn a row on with ORTMODULE_MEMORY_OPT_CONFIG=\"<cluster>:<strategy>:"
                         "<count>\" (count -1 = every occurrence; strategy 0 turns it off)")
        else:
            lines.append("  no recompute opportunities")
        lines.append(f"  predicted: forward peak {_mib(p['forward_peak'])}, saved for backward "
                     f"{_mib(p['saved'])}, outputs {_mib(p['outputs'])}, backward peak "
                     f"{_mib(p['backward_peak'])}, step peak {_mib(p['peak'])} "
                     f"({_mib(p['peak_outputs_released'])} if the outputs are let go before "
                     f"backward; constants {_mib(p['constants'])})")
        lines.append(f"    saved = {p['saved_formula'] or '0'} bytes")
        lines.append(f"    forward peak = {p['forward_formula'] or '0'} bytes")
        lines.append(f"    backward peak = {p['backward_formula'] or '0'} bytes")
        if not p["complete"]:
            lines.append(f"    incomplete: {len(self.unknown_values)} values have no size formula "
                         f"({', '.join(self.unknown_values[:5])}) or a dim is unbound")
        m = self.measured
        if m:
            ratio = f" (predicted / measured {p['peak'] / m['peak']:.2f})" if m["peak"] > 0 else ""
            lines.append(f"  measured (last step): forward peak {_mib(m['forward_peak'])}, saved "
                         f"{_mib(m['saved'])}, backward peak {_mib(m['backward_peak'])}, step peak "
                         f"{_mib(m['peak'])}{ratio}")
        return "\n".join(lines)

    __str__ = table
