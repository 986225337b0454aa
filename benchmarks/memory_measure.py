"""The memory benchmark's child side: one variant of one case at one batch size, in a
process of its own (benchmarks/memory.py starts it), measured three ways.

1. RSS: the resident set right before the forward of a steady-state step (optimizer state already
   allocated, gradients set to None; less the buffers an ORTModule's pool holds idle for the step,
   which are the step's) against its peak during forward + backward. The peak is the
   kernel's VmHWM, reset by writing "5" to /proc/self/clear_refs; where that is refused, a thread
   samples /proc/self/statm every millisecond instead (the method is recorded).
2. Allocator: the bytes torch's CPU allocator hands out during forward + backward of a second
   steady-state step, from torch.profiler(profile_memory=True)'s allocation records: the peak of
   their running sum (allocations made before the step and freed in it count nothing).
3. ORTModule only: the engine's own report, ortmodule.memory_report(batch): `predicted` before the
   first step, `measured` (the live bytes the engine held during its tracked step) after.
"""
from __future__ import annotations

import gc
import os
import resource
import statistics
import threading
import time

from common import pooled_idle_bytes

MIB = 1 << 20
ORT_LEVELS = {"ort0": "0", "ort1": "1", "ort2": "2"}  # variant -> ORTMODULE_MEMORY_OPT_LEVEL
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class PeakRss:
    """The peak RSS since the last reset(). process_peak: the peak since the process started
    (resets of the kernel's high-water mark lower getrusage's ru_maxrss too, so it is kept here)."""

    def __init__(self):
        self.method = "VmHWM reset through /proc/self/clear_refs"
        self.process_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self._sampled = 0
        self._stop: threading.Event | None = None
        try:
            self._clear()
            if _status_kib("VmHWM") * 1024 > rss_bytes() + 64 * MIB:  # the write did nothing
                raise OSError("VmHWM not reset")
        except OSError:
            self.method = "/proc/self/statm sampled every 1 ms by a thread"
            self._stop = threading.Event()
            threading.Thread(target=self._sample, daemon=True).start()

    @staticmethod
    def _clear() -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak resident set size (Linux ≥ 4.0)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._sampled = max(self._sampled, rss_bytes())
            time.sleep(0.001)

    def peak(self) -> int:
        if self._stop is None:
            return _status_kib("VmHWM") * 1024
        return max(self._sampled, rss_bytes())

    def reset(self) -> int:
        """Starts a new window; returns the RSS now."""
        self.process_peak = max(self.process_peak, self.peak())
        if self._stop is None:
            self._clear()
        now = rss_bytes()
        self._sampled = now
        return now


def allocator_peak(forward, backward) -> dict:
    """Peak bytes torch's CPU allocator held beyond what it held before, over forward() then
    backward(), with the forward's own peak, from the profiler's allocation records."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = forward()
        with record_function("memory_bench::forward_done"):
            pass
        backward(out)
    records, marker = [], None
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            records.append((node.start_time_ns, node.extra_fields.alloc_size))
        elif node.name == "memory_bench::forward_done":
            marker = node.start_time_ns
    running = peak = forward_peak = 0
    for t, size in sorted(records):
        running += size
        peak = max(peak, running)
        if marker is None or t <= marker:
            forward_peak = peak
    return {"peak_mib": peak / MIB, "forward_peak_mib": forward_peak / MIB, "end_mib": running / MIB,
            "allocations": sum(1 for _, s in records if s > 0)}


def _report_dict(report) -> dict:
    return {"predicted": {k: v for k, v in report.predicted.items() if not isinstance(v, str)},
            "measured": dict(report.measured) if report.measured else None,
            "rows": [dict(cluster=r.cluster, strategy=r.strategy, occurrences=r.occurrences,
                          enabled=r.enabled, bytes_saved=r.bytes_saved) for r in report.rows]}


def measure(case: dict, variant: str, steps: int, warmup: int, profile: bool) -> dict:
    """One variant at case["batch"]: first step, warmup steps, the RSS step, the profiled step
    (when `profile`), then `steps` timed steps; AdamW throughout."""
    if variant in ORT_LEVELS:  # read when ORTModule is constructed
        os.environ["ORTMODULE_MEMORY_OPT_LEVEL"] = ORT_LEVELS[variant]
    import torch
    from suite import build
    peak = PeakRss()
    torch.manual_seed(0)
    model, make_batch, loss_of, _ = build(case)
    params = list(model.parameters())
    result = {"batch": case["batch"], "threads": torch.get_num_threads(), "rss_method": peak.method,
              "parameters": sum(p.numel() for p in params), "ort": None}
    if variant == "compile":
        model = torch.compile(model)
    elif variant in ORT_LEVELS:
        from torch_ort import ORTModule
        model = ORTModule(model)
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)
    args, kwargs = make_batch(gen)
    if variant in ORT_LEVELS:
        result["ort"] = {"level": int(ORT_LEVELS[variant])}
        if hasattr(model, "memory_report"):
            start = time.perf_counter()
            try:  # before any step: the prediction only (export and engine build, no step run)
                result["ort"].update(_report_dict(model.memory_report(*args, **kwargs)))
            except Exception as e:  # the API is young: record why, measure the rest
                result["ort"]["error"] = f"{type(e).__name__}: {e}"[:500]
            result["ort"]["report_s"] = time.perf_counter() - start
        else:
            result["ort"]["error"] = "ORTModule has no memory_report (this build predates it)"

    def step(batch=None) -> tuple[float, float]:
        a, kw = batch or make_batch(gen)
        start = time.perf_counter()
        loss = loss_of(model(*a, **kw))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start, loss.item()

    result["first_step_s"], _ = step((args, kwargs))
    for _ in range(warmup):
        step()

    # The RSS step: forward and backward each watched, then the optimizer.
    a, kw = make_batch(gen)
    gc.collect()
    before = peak.reset()
    idle = pooled_idle_bytes(model)  # resident, but the step's (ORTMODULE_CPU_BUFFER_POOL)
    before -= idle
    loss = loss_of(model(*a, **kw))
    forward = peak.peak()
    loss.backward()
    backward = peak.peak()
    opt.step()
    opt.zero_grad(set_to_none=True)
    result["rss"] = {"before_mib": before / MIB, "pool_idle_mib": idle / MIB, "forward_peak_mib": forward / MIB,
                     "peak_mib": backward / MIB, "step_peak_mib": peak.peak() / MIB,
                     "activation_mib": (backward - before) / MIB,
                     "forward_activation_mib": (forward - before) / MIB}
    del loss

    result["allocator"] = None
    if profile:
        a, kw = make_batch(gen)
        gc.collect()
        result["allocator"] = allocator_peak(lambda: loss_of(model(*a, **kw)), lambda loss: loss.backward())
        opt.step()
        opt.zero_grad(set_to_none=True)

    times, loss = [], None
    for _ in range(steps):
        seconds, loss = step()
        times.append(seconds)
    result.update(median_step_s=statistics.median(times) if times else None, times_s=times,
                  last_loss=loss, process_peak_rss_mib=max(peak.process_peak, peak.peak()) / MIB)
    if result["ort"] is not None and "error" not in result["ort"]:
        try:  # after the steps: the engine's measurement of its tracked step, same input sizes
            result["ort"]["measured"] = _report_dict(model.memory_report(*args, **kwargs))["measured"]
        except Exception as e:
            result["ort"]["error"] = f"{type(e).__name__}: {e}"[:500]
    return result
