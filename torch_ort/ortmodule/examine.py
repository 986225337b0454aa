"""torch_ort.examine(model, *args, **kwargs): what of a model runs where, and what a training step
will cost, before training.

It exports the model and builds its engine for the given example inputs, as the first call would,
through an ORTModule of its own (the model, and an ORTModule the caller holds, are left as they
are). When the engine takes the whole model nothing runs. When it does not and the fallback policy
would run the model partially (partial.py), the split is what decides where each submodule runs,
and that needs the submodules' real inputs: the model's forward then runs once, without a
backward, with the random number generators' and the buffers' states restored afterwards, so
neither the parameters nor anything the next step sees changes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Iterator

import torch

from torch_ort.ortmodule.policy import partial
from torch_ort.ortmodule.policy.fallback_policy import ORTModuleError
from torch_ort.ortmodule.export.translations.aten_op import DOMAIN, qualified_name
from torch_ort.ortmodule.ortmodule import ORTModule

_OURS = f"{DOMAIN}::"
# nodes that call back into ATen's dispatcher or Python (and their gradients): reported by what
# they call, not as kernels
_HOST_OPS = ("ATenOp", "PythonOp")


def _mib(n: int | None) -> str:
    if n is None:
        return "unknown"
    return f"{n / 2 ** 20:,.1f} MiB" if n >= 2 ** 20 else f"{n / 2 ** 10:,.1f} KiB"


@dataclasses.dataclass
class Part:
    """A module or submodule and where it runs in training."""

    name: str                   # "" for the model itself, else its qualified submodule name
    runs: str                   # "engine", "eager", "split" (eager itself, parts of it listed after)
    reason: str = ""            # why it is not in the engine
    predicted_peak: int | None = None  # bytes its engine's step needs (engine parts, training)


@dataclasses.dataclass
class Examination:
    """The result of torch_ort.examine; str() gives the report."""

    model: str                  # the model's class
    training: bool              # a training step was examined (else inference)
    parts: list[Part]
    engine_parameter_share: float  # of the parameter elements, in engine parts
    engine_flop_share: float | None  # of the forward's FLOPs, in engine parts (None: not counted)
    kernels: dict[str, int]     # ops on the engine's own kernels, with their node counts
    aten_fallback: dict[str, str]  # operators run through the ATen fallback, with why
    python_ops: list[str]       # torch.autograd.Functions run as PythonOp nodes
    predicted_peak: int | None  # bytes, the whole step's, when the engine has the whole model
    export_seconds: float
    build_seconds: float
    advice: list[str]

    @property
    def runs(self) -> str:
        """Where the model runs: "engine", "split" (parts in the engine) or "eager"."""
        return self.parts[0].runs

    def __str__(self) -> str:
        step = "training step" if self.training else "inference call"
        lines = [f"torch_ort.examine: {self.model} ({step})"]
        for p in self.parts:
            where = {"engine": "engine", "eager": "eager PyTorch",
                     "split": "eager PyTorch, its submodules below where they can"}[p.runs]
            name = p.name or "(the model)"
            extra = f", predicted peak {_mib(p.predicted_peak)}" if p.predicted_peak is not None else ""
            lines.append(f"  {name}: {where}{extra}")
            if p.reason:
                lines.append(f"      why: {p.reason.splitlines()[0][:300]}")
        lines.append(f"  in the engine: {self.engine_parameter_share:.0%} of the parameters"
                     + (f", {self.engine_flop_share:.0%} of the forward's FLOPs"
                        if self.engine_flop_share is not None else ""))
        if self.kernels:
            top = sorted(self.kernels.items(), key=lambda kv: -kv[1])
            lines.append(f"  engine kernels: {sum(self.kernels.values())} nodes of {len(top)} ops ("
                         + ", ".join(f"{op} {n}" for op, n in top[:12]) + (", ..." if len(top) > 12 else "")
                         + ")")
        for op, why in sorted(self.aten_fallback.items()):
            lines.append(f"  ATen fallback: {op} ({why})")
        for name in self.python_ops:
            lines.append(f"  PythonOp: {name}")
        if self.predicted_peak is not None:
            lines.append(f"  predicted step peak (beyond parameters and optimizer state): "
                         f"{_mib(self.predicted_peak)}")
        lines.append(f"  export {self.export_seconds:.1f} s, engine build {self.build_seconds:.1f} s")
        lines += [f"  to change: {a}" for a in self.advice] or ["  nothing to change"]
        return "\n".join(lines)


@contextlib.contextmanager
def _state_kept(module: torch.nn.Module) -> Iterator[None]:
    """The forward's side effects on buffers (BatchNorm's running statistics) and on the random
    number generators undone."""
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)


def _count(engine, kernels: dict[str, int]) -> None:
    for op, n in engine.stats().get("op_counts", {}).items():
        if op.startswith(_OURS) and op[len(_OURS):].startswith(_HOST_OPS):
            continue  # reported by what they call
        kernels[op] = kernels.get(op, 0) + n


def examine(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Examination:
    """Exports `model` and builds its engine for these example inputs, then reports what runs
    where (engine, ATen fallback, PythonOp, eager submodules with the reasons), the predicted peak
    memory of a step, and what to change. A model in training mode with parameters that require
    grad is examined for a training step, else for inference. `model` may be an ORTModule (its
    wrapped module is examined, under the same DebugOptions)."""

    debug = model._debug if isinstance(model, ORTModule) else None
    module = model.module if isinstance(model, ORTModule) else model
    wrapper = ORTModule(module, debug)
    training = module.training and any(p.requires_grad for p in module.parameters())
    grad = torch.enable_grad() if training else torch.no_grad()
    kernels: dict[str, int] = {}
    advice: list[str] = []
    if wrapper._fallback.active:  # forced by ORTMODULE_FALLBACK_POLICY, or no usable extension
        status = wrapper._fallback.status
        return Examination(type(module).__name__, training,
                           [Part("", "eager", status.reason if status is not None else "fallback forced")],
                           0.0, 0.0, {}, {}, [], None, 0.0, 0.0, advice)
    with grad:
        try:
            runner, engine, tensors, _, training = wrapper._prepare(args, kwargs)
        except ORTModuleError as error:
            runner = engine = None
            whole_error = error
    if engine is not None:
        _count(engine, kernels)
        peak = wrapper._memory.report_of(engine, runner, [t.shape for t in tensors]) if training else None
        parts = [Part("", "engine", "", peak.predicted["peak"] if peak is not None else None)]
        python_ops = sorted(set(runner.export.python_ops))
        share, seconds = (1.0, 1.0), (runner.export.seconds, runner.build_seconds)
        if peak is not None:
            _memory_advice(peak, advice)
        if runner.export.logits_output is not None and training and not wrapper._settings.skip_logits:
            advice.append("the model returns `logits` beside its `loss`: if the loop reads only the loss, "
                          "ORTMODULE_SKIP_LOGITS=1 never computes the batch x sequence x vocabulary logits")
        fallback = dict(wrapper._aten_fallback.reasons)
    else:
        parts, python_ops, share, seconds, fallback = _split(wrapper, whole_error, training, args, kwargs,
                                                             kernels, advice)
    if fallback:
        advice.append(f"{len(fallback)} operator(s) run through the ATen fallback: correct, but each is a "
                      "dispatcher call the engine cannot fuse (docs/ops.md lists the ops with kernels)")
    if python_ops:
        advice.append("custom autograd Functions run as PythonOp nodes, a call into Python each; to let "
                      "the exporter trace through one instead: ORTMODULE_SKIPPED_AUTOGRAD_FUNCTIONS="
                      + ",".join(python_ops))
    return Examination(type(module).__name__, training, parts, share[0], share[1], kernels,
                       {qualified_name(op): why for op, why in fallback.items()}, python_ops,
                       parts[0].predicted_peak if parts[0].runs == "engine" else None,
                       seconds[0], seconds[1], advice)


def _memory_advice(report, advice: list[str]) -> None:
    peak = report.predicted["peak"]
    free = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        free = torch.cuda.mem_get_info()[0]
    elif hasattr(os, "sysconf") and "SC_AVPHYS_PAGES" in os.sysconf_names:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    saving = sum(r.bytes_saved_each * (r.occurrences - r.enabled) for r in report.rows
                 if r.bytes_saved_each > 0)
    if free is not None and peak > free:
        advice.append(f"the predicted step peak ({_mib(peak)}) exceeds the free memory ({_mib(free)}): "
                      "ORTMODULE_MEMORY_OPT_LEVEL=1 recomputes per layer"
                      + (f" (saves up to {_mib(saving)})" if saving else "")
                      + ", or set ORTMODULE_MEMORY_BUDGET")
    elif saving and report.level == 0:
        advice.append(f"if memory is short: ORTMODULE_MEMORY_OPT_LEVEL=1 would save up to {_mib(saving)} "
                      "by recomputing in backward")


def _split(wrapper, error: ORTModuleError, training: bool, args, kwargs, kernels, advice):
    """The parts of a model the engine cannot take whole."""
    reason = f"{type(error).__name__}: {error}"
    runs_partially = wrapper._settings.partial_acceleration and partial.splits(error)
    if not wrapper._fallback.covers(error):
        advice.append(f"under ORTMODULE_FALLBACK_POLICY={wrapper._fallback.policy.name} "
                      "training raises this error; the default policy runs the model in eager PyTorch"
                      + (", its largest submodules in the engine" if runs_partially else ""))
    if _data_dependent(reason):
        advice.append("the model branches on a tensor's value (a data-dependent Python `if`): compute the "
                      "branch with tensor ops (torch.where) or move it out of the forward, and the engine "
                      "takes the whole model")
    if not (runs_partially and wrapper._fallback.covers(error)):
        return [Part("", "eager", reason)], [], (0.0, 0.0), (0.0, 0.0), {}
    split = partial.Split(wrapper, ORTModule)
    if not split.entries:
        return [Part("", "eager", reason)], [], (0.0, 0.0), (0.0, 0.0), {}
    wrapper._split = split
    with _state_kept(wrapper.module), (torch.enable_grad() if training else torch.no_grad()):
        split.run(args, kwargs)
    parts = [Part("", "split", reason)]
    python_ops: set[str] = set()
    fallback: dict = {}
    export_s = build_s = 0.0
    wrappers = {id(e.wrapper.module): e.wrapper for e in _entries(split)}
    for s in split.statuses():
        w = wrappers.get(id(_submodule(wrapper.module, s.name)))
        peak = None
        if s.runs == "engine" and w is not None and w._last_engine is not None:
            _count(w._last_engine, kernels)
            python_ops.update(w._last_runner.export.python_ops)
            fallback.update(w._aten_fallback.reasons)
            export_s += w._last_runner.export.seconds
            build_s += w._last_runner.build_seconds
            if training and w._memory.last is not None:
                peak = w._memory.report_of(*w._memory.last).predicted["peak"]
        parts.append(Part(s.name, s.runs, s.reason, peak))
        if s.runs == "eager" and _data_dependent(s.reason):
            advice.append(f"{s.name} branches on a tensor's value: with the branch written in tensor ops "
                          "the engine takes it too")
    shares = (split.engine_parameter_share(), split.engine_flop_share())
    return parts, sorted(python_ops), shares, (export_s, build_s), fallback


def _data_dependent(reason: str) -> bool:
    return any(k in reason for k in ("data-dependent", "DataDependent", "data dependent"))


def _entries(split) -> Iterator:
    for e in split.entries:
        yield e
        if e.wrapper._split is not None:
            yield from _entries(e.wrapper._split)


def _submodule(root: torch.nn.Module, name: str) -> torch.nn.Module | None:
    try:
        return root.get_submodule(name)
    except AttributeError:
        return None
