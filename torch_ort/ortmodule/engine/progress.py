"""What a slow first step is doing, on stderr: the export and the engine build of a new input
schema take seconds (tens on a large model) and would otherwise print nothing.

Nothing is printed when the preparation finishes within DELAY seconds. Past that, one line names
the stage it is in, each later stage gets a line as it starts, and a last line gives the time each
stage took. ORTMODULE_PROGRESS=0 turns it off; ranks other than 0 of a process group stay quiet.

A preparation inside another one (a submodule's under partial acceleration) reports through the
outer one, its stages named after the submodule.
"""
from __future__ import annotations

import sys
import threading
import time

DELAY = 3.0  # seconds of silence before the first line

# the preparation this thread is in: .name (None: none), .enabled, .prefix (the submodules'
# names), .start, .current (its Progress once a stage began)
_local = threading.local()


def _rank_zero() -> bool:
    try:
        import torch.distributed as dist
        return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
    except Exception:  # noqa: BLE001 -- a broken process group must not fail the step
        return True


class Progress:
    """One preparation: stages with their start times; lines once DELAY has passed."""

    def __init__(self, name: str, enabled: bool, stream=None, delay: float | None = None,
                 start: float | None = None):
        self._name = name
        self._enabled = enabled and _rank_zero()
        self._stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()
        self._start = time.perf_counter() if start is None else start
        self._stages: list[tuple[str, str, float]] = []  # (stage, submodule or "", start)
        self._shown = False
        self._timer = None
        if self._enabled:
            wait = DELAY if delay is None else delay
            self._timer = threading.Timer(max(0.0, wait - (time.perf_counter() - self._start)), self._show)
            self._timer.daemon = True
            self._timer.start()

    def _write(self, text: str) -> None:
        try:
            print(f"torch_ort: {text}", file=self._stream, flush=True)
        except (OSError, ValueError):  # a closed stream: progress is not worth an error
            pass

    def _show(self) -> None:
        with self._lock:
            if self._shown or self._timer is None:
                return
            self._shown = True
            stage = self._label(*self._stages[-1][:2]) if self._stages else "preparing"
            elapsed = time.perf_counter() - self._start
            self._write(f"{self._name}: {stage} ({elapsed:.0f} s so far; the first call with new input "
                        "shapes exports and builds; ORTMODULE_PROGRESS=0 silences this)")

    @staticmethod
    def _label(text: str, where: str) -> str:
        return f"{where}: {text}" if where else text

    def stage(self, text: str, where: str = "") -> None:
        with self._lock:
            self._stages.append((text, where, time.perf_counter()))
            if self._shown:
                self._write(f"{self._name}: {self._label(text, where)}")

    def finish(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = None
            if not self._shown:
                return
            end = time.perf_counter()
            took: dict[str, float] = {}
            # per stage, summed over the submodules that went through it
            for (stage, _, start), (_, _, stop) in zip(self._stages, [*self._stages[1:], ("", "", end)]):
                took[stage] = took.get(stage, 0.0) + stop - start
            parts = ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in took.items())
            self._write(f"{self._name}: ready in {end - self._start:.1f} s ({parts})")


class preparing:
    """`with preparing(name, enabled):` reports the stages (stage()) of the preparation of module
    `name` in this thread. Entered on every call, so it does almost nothing unless a stage comes:
    the timer starts with the first stage."""

    __slots__ = ("_name", "_enabled", "_outer")

    def __init__(self, name: str, enabled: bool):
        self._name, self._enabled = name, enabled

    def __enter__(self):
        self._outer = getattr(_local, "name", None) is not None
        if self._outer:  # a submodule's: its stages go to the outer line, named
            _local.prefix = (*_local.prefix, self._name)
        else:
            _local.name, _local.enabled, _local.prefix = self._name, self._enabled, ()
            _local.start, _local.current = time.perf_counter(), None

    def __exit__(self, *exc):
        if self._outer:
            _local.prefix = _local.prefix[:-1]
            return
        progress, _local.current, _local.name = _local.current, None, None
        if progress is not None:
            progress.finish()


def stage(text: str) -> None:
    """The preparation in this thread (if any) enters stage `text`."""
    if getattr(_local, "name", None) is None:
        return
    if _local.current is None:
        _local.current = Progress(_local.name, _local.enabled, start=_local.start)
    _local.current.stage(text, _local.prefix[-1] if _local.prefix else "")
