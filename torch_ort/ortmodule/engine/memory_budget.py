"""ORTMODULE_MEMORY_BUDGET: before the first step, the cheapest plan (recompute level, chunks of
the fused LM head and loss) whose predicted step peak fits the budget, or an error naming the
smallest budget any plan needs."""
from __future__ import annotations

from dataclasses import dataclass

from torch_ort.ortmodule.policy.debug_options import LOGGER


class MemoryBudgetError(ValueError):
    """ORTMODULE_MEMORY_BUDGET is below what any plan needs for a step of these inputs."""


# Logits bytes per chunk the budget planner tries for the fused LM head and loss, after its
# default of 256 MiB (LinearCrossEntropy: one chunk × V of logits at a time): the halvings at
# every recompute level first, the small chunks last.
BUDGET_CHUNKS = (128 << 20, 64 << 20)
SMALL_CHUNKS = (32 << 20, 8 << 20, 2 << 20)


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


def within_budget(engine, compile_with, user_sizes: list, sizes: list, settings) -> tuple:
    """ORTMODULE_MEMORY_BUDGET: the cheapest plan whose predicted step peak (the memory
    report's, plus the kernels' own chunks) fits, in order: as configured, 128 and 64 MiB chunks
    of the fused LM head and loss, then recompute levels 1 and 2 (each with the three), then
    32, 8 and 2 MiB chunks, each at every level. Raises MemoryBudgetError naming the smallest
    budget any plan needs when none fits. `compile_with(level, chunk_bytes)` builds the engine
    under a plan; `sizes`: the call's input sizes, parameters included; `user_sizes` the inputs'
    alone (for the message). Returns (engine, MemoryPlan)."""
    budget, level0 = settings.memory_budget, settings.memory_opt_level
    fused = engine.stats()["kernel_workspace_bytes"] > 0  # a LinearCrossEntropy to chunk
    levels = sorted({level0, 1, 2} - set(range(level0)))
    # Cheapest first. Every chunk reads the head's weight twice and adds into the whole weight
    # gradient, so what a chunk size costs grows with the number of chunks: on the SFT benchmark
    # (vocabulary 128k) 32 MiB chunks (65 rows) added 44 % to the step, 128 and 64 MiB ones little.
    # Recompute costs a forward per layer and lowers the peak only where activations make it; the
    # small chunks come last, each at the lowest level that fits.
    plans = [(level, chunk) for level in levels for chunk in (0, *BUDGET_CHUNKS)]
    plans += [(level, chunk) for chunk in SMALL_CHUNKS for level in levels]
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
            return engine, plan
        if smallest is None or need < smallest.predicted:
            smallest = plan
    raise MemoryBudgetError(
        f"ORTMODULE_MEMORY_BUDGET={_gib(budget)}: no plan fits a step of inputs sized {user_sizes}; "
        f"the smallest predicted step peak is {_gib(smallest.predicted)} ({smallest.plan_text()}): set a budget of at "
        f"least {_gib(smallest.predicted)}, or smaller inputs")
