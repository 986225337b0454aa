"""Memory monitoring of one ORTModule: the memory report at INFO when a training engine first
runs (predicted before the step), that step measured (INFO: measured against predicted), and
ORTMODULE_PRINT_MEMORY_STATS=1: measured memory before and after forward and backward."""
from __future__ import annotations

import logging
import os
import resource
from collections import OrderedDict

import torch

from torch_ort.ortmodule.engine.memory_report import MemoryReport, _mib
from torch_ort.ortmodule.policy.debug_options import LOGGER

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size now (Linux /proc; the peak from getrusage elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


_KEEP = 16  # engines whose last measurement is remembered (re-exports make new ones)


class MemoryMonitor:
    """hook(...) gives the bridge a `report(phase)` callable for the calls that need one — the
    first training step of each engine, every step under ORTMODULE_PRINT_MEMORY_STATS — and None
    otherwise, so that steady-state steps pay nothing."""

    def __init__(self, settings):
        self.print_stats = settings.print_memory_stats
        self.level = settings.memory_opt_level
        self.config = os.environ.get("ORTMODULE_MEMORY_OPT_CONFIG", "").strip()
        self.step = 0
        self.last = None  # (engine, runner, user input sizes) of the last training call
        self._measured: OrderedDict = OrderedDict()  # id(engine) -> (engine, sizes, measured dict)

    def report_of(self, engine, runner, user_sizes) -> MemoryReport:
        """The engine's report for user inputs of these sizes (the parameters' come from the
        runner: an export fixes them)."""
        user_sizes = [list(s) for s in user_sizes]
        sizes = user_sizes + [list(p.shape) for p in runner.params]
        kept = self._measured.get(id(engine))
        measured = kept[2] if kept and kept[0] is engine and kept[1] == sizes else None
        return MemoryReport.from_engine(engine.memory_report(sizes),
                                        dict(zip(engine.input_names, user_sizes)), self.level,
                                        self.config, measured)

    def hook(self, engine, runner, tensors, training: bool):
        """`tensors`: the call's user tensors (parameters are the runner's)."""
        kept = self._measured.get(id(engine))
        first = training and (kept is None or kept[0] is not engine)
        if training:
            self.last = (engine, runner, [t.shape for t in tensors])
        if not (first or self.print_stats):
            if kept is not None and kept[2] is None:  # its first backward never ran
                engine.set_memory_tracking(False)
            return None
        sizes = [list(t.shape) for t in tensors] + [list(p.shape) for p in runner.params]
        if first:
            self._remember(engine, sizes, None)
            if LOGGER.isEnabledFor(logging.INFO):
                LOGGER.info("%s", self.report_of(*self.last).table())
        engine.set_memory_tracking(True)

        def report(phase: str) -> None:
            if self.print_stats:
                self._print(phase, engine)
            if phase == "post-backward" or (phase == "post-forward" and not training):
                measured = engine.measured_memory()
                self._remember(engine, sizes, measured)
                if first and training:
                    predicted = engine.memory_report(sizes)["predicted"]["peak"]
                    LOGGER.info("memory: first step measured peak %s of activations (forward %s, "
                                "backward %s); predicted %s (%.2f× measured)", _mib(measured["peak"]),
                                _mib(measured["forward_peak"]), _mib(measured["backward_peak"]),
                                _mib(predicted), predicted / max(measured["peak"], 1))
                if not self.print_stats:
                    engine.set_memory_tracking(False)
        return report

    def forget(self, runner) -> None:
        """The runner left ORTModule's plan cache: drop what holds its engines, so they are freed."""
        engines = {id(e) for e in runner._engines.values()}
        for key in [k for k, (e, _, _) in self._measured.items() if id(e) in engines]:
            del self._measured[key]
        if self.last is not None and self.last[1] is runner:
            self.last = None

    def _remember(self, engine, sizes, measured) -> None:
        self._measured[id(engine)] = (engine, sizes, measured)
        self._measured.move_to_end(id(engine))
        while len(self._measured) > _KEEP:
            self._measured.popitem(last=False)

    def _print(self, phase: str, engine) -> None:
        """One log line per phase: step, phase, RSS, peak RSS, CUDA allocated/peak when in use,
        and after backward the activation bytes the engine measured in that step."""
        if phase == "pre-forward":
            self.step += 1
        mib = 1 << 20
        line = (f"[memory] step {self.step} {phase}: rss {rss_bytes() / mib:.1f} MiB, peak rss "
                f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            line += (f", cuda allocated {torch.cuda.memory_allocated() / mib:.1f} MiB, cuda peak "
                     f"{torch.cuda.max_memory_allocated() / mib:.1f} MiB")
        m = engine.measured_memory()
        if phase == "post-backward" and m["backward_peak"] >= 0:
            line += (f", engine backward peak {_mib(m['backward_peak'])}, step peak "
                     f"{_mib(m['peak'])}")
        LOGGER.warning(line)
