"""A runner's graphs for the outcomes of its data-dependent decisions (export/decisions.py).

An export that took a decision from its call's values checks it on every later call; a call
whose values flip it raises `_C.DecisionChangedError` before any output is returned. The runner
then switches to a graph it exported earlier for another outcome, if one has not been tried for
this call, or exports again with this call's values, keeping the graph it had. The checks run
after the graph's other nodes, so a flipped decision may fail a kernel of the wrong branch first:
a kernel error in such a graph is retried the same way, until a graph exported for the call
itself fails (then the error is the module's own, as eager would raise it). A module whose
decisions keep changing (more than MAX_FLIPS times) raises ORTModuleONNXModelException, which the
fallback policy handles like any graph the engine cannot run.
"""
from __future__ import annotations

from torch_ort.ortmodule.policy.debug_options import LOGGER
from torch_ort.ortmodule.policy.fallback_policy import ORTModuleONNXModelException

MAX_VARIANTS = 4  # graphs kept for other outcomes
MAX_FLIPS = 64  # decisions changed over a runner's life before it gives up
# What one export of a GraphRunner is: swapped as a whole.
_STATE = ("export", "_slots", "_param_dtypes", "buffer_updates", "_engines", "_release_plans", "_shape_plan")


def changed(error: BaseException) -> bool:
    """The engine found a decision its export took that does not hold for this call."""
    from torch_ort import _C
    return isinstance(error, _C.DecisionChangedError)


def may_have_changed(runner, error: BaseException) -> bool:
    """A kernel failed in a graph that took decisions from values: its checks run last, so a
    flipped decision can fail a kernel of the wrong branch first (eager would have raised its own
    error, or gone the other way). Worth one more try, with a graph for this call's values."""
    from torch_ort import _C
    return runner.export.decisions > 0 and isinstance(error, _C.KernelError)


def disagreement(runner, error: BaseException) -> ORTModuleONNXModelException:
    """A graph exported with this call's values fails its own decision check: the values the
    export took the decision from are not the ones the engine computes (exporting again would
    decide the same way). The fallback policy handles it like any graph the engine cannot run."""
    return ORTModuleONNXModelException(
        f"{type(runner._module).__name__}: a graph exported with this call's values does not hold "
        f"its own data-dependent decision when run ({error}); the values torch.export computed "
        f"while exporting differ from the engine's")


class Variants:
    def __init__(self) -> None:
        self.saved: list[dict] = []
        self.flips = 0

    def switch(self, runner, error: BaseException, args: tuple, kwargs: dict, tried: set) -> bool:
        """Make `runner` hold a graph for this call's outcome: a saved one not in `tried` (ids
        of the exports this call already ran), else a new export of this call (then True)."""
        self.flips += 1
        name = type(runner._module).__name__
        if self.flips > MAX_FLIPS:
            raise ORTModuleONNXModelException(
                f"{name}: a data-dependent decision changed {self.flips} times; exporting once per "
                f"outcome is not worth it for this module ({error})") from error
        current = {k: getattr(runner, k) for k in _STATE}
        for i, state in enumerate(self.saved):
            if id(state["export"]) not in tried:
                LOGGER.info("%s: %s; running the graph exported for the other outcome", name, error)
                self.saved[i] = current
                for k, v in state.items():
                    setattr(runner, k, v)
                return False
        LOGGER.info("%s: %s; exporting again with this call's values", name, error)
        self.saved = [current, *self.saved][:MAX_VARIANTS]
        runner._export(args, kwargs)
        return True
