"""ORTMODULE_PRINT_MEMORY_STATS=1: measured memory before and after forward and backward."""
from __future__ import annotations

import os
import resource

import torch

from torch_ort.ortmodule.options import LOGGER

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size now (Linux /proc; the peak from getrusage elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class MemoryReporter:
    """One log line per phase: step, phase, RSS, peak RSS, and CUDA allocated/peak when in use."""

    def __init__(self):
        self.step = 0

    def report(self, phase: str) -> None:
        if phase == "pre-forward":
            self.step += 1
        mib = 1 << 20
        line = (f"[memory] step {self.step} {phase}: rss {rss_bytes() / mib:.1f} MiB, peak rss "
                f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            line += (f", cuda allocated {torch.cuda.memory_allocated() / mib:.1f} MiB, cuda peak "
                     f"{torch.cuda.max_memory_allocated() / mib:.1f} MiB")
        LOGGER.warning(line)
