"""The autograd bridge: the user tensors AND the parameters are inputs of autograd nodes, so
PyTorch fills param.grad (and DDP's hooks fire) exactly as in eager.

A training call is a chain of nodes sharing one backward run of the engine:

    params group k ─▶ Release k ─▶ ... ─▶ Release 0 ─▶ EngineFunction ─▶ outputs
    (+ user tensors in the last group)        ▲ carriers: empty tensors that order the chain

In backward, EngineFunction binds the output gradients; then Release 0 runs the engine's backward
until group 0's gradients are final and returns them, and autograd accumulates them into .grad
(AccumulateGrad runs before any other ready node) — firing DDP's hooks, whose buckets all-reduce
while Release 1 runs the next piece. Groups are made once per engine (ReleasePlan) from when each
parameter's gradient is final; ORTMODULE_GRADIENT_RELEASE=0 makes one group (all at the end).

A backward that fails inside the engine after groups were handed over puts those parameters'
.grad back as they were before that backward (_Handover): a .grad that was None is None again
(free: nothing is copied). A .grad that already held values (gradient accumulation,
zero_grad(set_to_none=False)) is copied when its group is handed over — and only when the
engine's backward runs code we do not control (PythonOp, ATenOp, ATenOpGrad nodes:
Engine.backward_runs_opaque_code), the failures a user can meet and retry; then it gets its old
values back, bitwise. Without such nodes only our kernels run, which fail on out of memory or a
device fault: the None ones go back to None, the accumulated ones stay accumulated. Only that
module call's parameters are put back: another ORTModule of the same graph whose backward already
finished, and eager parameters, keep what they got. The records (and copies) live as long as the
autograd backward call, failing or not (_Handover.open)."""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from torch_ort import _compat
from torch_ort.ortmodule.export import python_op


@dataclass(frozen=True)
class ReleaseGroup:
    steps: int            # backward steps to run before handing these over (-1: all)
    inputs: tuple         # graph input indices whose gradients this node returns


@dataclass(frozen=True)
class ReleasePlan:
    groups: tuple         # ReleaseGroup, in the order backward hands them over
    copy_grads: bool      # backward may raise from user/ATen code: copy an early group's .grad

    @staticmethod
    def build(engine, num_tensors: int, params: list, min_bytes: int) -> "ReleasePlan":
        """Parameters in the order their gradients become final, cut into groups of at least
        `min_bytes` (0: a single group at the end). User tensors' gradients, and parameters
        without one, go with the last group."""
        n = num_tensors + len(params)
        ready = engine.input_grad_ready
        groups, current, size = [], [], 0
        if min_bytes > 0:
            order = sorted((i for i in range(num_tensors, n) if ready[i] >= 0), key=lambda i: ready[i])
            for i in order:
                if current and size >= min_bytes and ready[i] != ready[current[-1]]:
                    groups.append(ReleaseGroup(ready[current[-1]], tuple(current)))
                    current, size = [], 0
                current.append(i)
                p = params[i - num_tensors]
                size += p.numel() * p.element_size()
        taken = {i for g in groups for i in g.inputs}
        groups.append(ReleaseGroup(-1, tuple(i for i in range(n) if i not in taken)))
        return ReleasePlan(tuple(groups), bool(engine.backward_runs_opaque_code))


class _Handover:
    """The .grad, as before this backward, of the parameters one training call handed over before
    its backward finished (module doc). A parameter is recorded once: the first record is the
    state to restore."""

    def __init__(self):
        self.records: dict = {}  # id(param) -> (param, its .grad object or None, a copy or None)

    @classmethod
    def open(cls) -> "weakref.ref":
        """A new handover owned by the running autograd backward call: the graph task holds the
        only strong reference (its final callback), runs it when the backward succeeds and drops
        it when the backward fails anywhere — in our nodes or in user code between them (final
        callbacks run only on success) — so neither records nor copies outlive the call."""
        handover = cls()
        _compat.queue_backward_callback(handover.close)
        return weakref.ref(handover)

    def close(self) -> None:
        self.records = {}

    def record(self, params, copy: bool) -> None:
        for p in params:
            if id(p) in self.records:
                continue
            g = p.grad
            if g is None:
                self.records[id(p)] = (p, None, None)
            elif copy:
                self.records[id(p)] = (p, g, g.detach().clone())
            # else: a failure of our own kernels leaves it accumulated (module doc)

    def restore(self) -> None:
        records, self.records = self.records, {}
        with torch.no_grad():
            for p, grad, copy in records.values():
                if grad is not None:
                    grad.copy_(copy)
                p.grad = grad


class _Backward:
    """One training call's backward, shared by its chain of nodes."""

    def __init__(self, engine, report, plan: ReleasePlan, params: list = (), num_tensors: int = 0):
        self.engine, self.report, self.plan = engine, report, plan
        self.params, self.num_tensors = params, num_tensors  # graph input i >= num_tensors: params[i - n]
        self.run_ctx = None   # the forward's saved set, until backward begins
        self.run = None       # the engine's BackwardRun, until the last group is handed over
        self.handover = None  # weakref to the _Handover, once a group is handed over early

    def begin(self, grad_outputs) -> None:
        run_ctx, self.run_ctx = self.run_ctx, None
        if run_ctx is None:
            raise RuntimeError("torch_ort: backward through the same ORTModule output twice; "
                               "pass retain_graph=True to the first backward is not supported")
        diff = self.engine.output_differentiable
        grads = [g if d else None for g, d in zip(grad_outputs, diff)]
        if self.report:
            self.report("pre-backward")
        with python_op.errors_as_raised():
            self.run = self.engine.backward_begin(run_ctx, grads)
        # A backward that needs only some groups (torch.autograd.grad, backward(inputs=...)) never
        # asks for the last one: free the run when autograd's backward call ends either way.
        _compat.queue_backward_callback(self.end)

    def end(self) -> None:
        self.run = None  # frees whatever the engine still held

    def take(self, k: int) -> list:
        if self.run is None:
            raise RuntimeError("torch_ort: internal: a gradient group was asked for before the "
                               "backward began or after it ended")
        group = self.plan.groups[k]
        try:
            with python_op.errors_as_raised():
                grads = self.engine.backward_take(self.run, group.steps, list(group.inputs))
        except BaseException:
            self.end()  # the backward is over: nothing may keep its activations alive
            handover = self.handover() if self.handover is not None else None
            if handover is not None:  # gradients handed over earlier go back (module doc)
                handover.restore()
            raise
        if k == len(self.plan.groups) - 1:
            self.end()
            if self.report:
                self.report("post-backward")
        else:  # a later group may still fail: remember the .grads this one is about to change
            if self.handover is None:
                self.handover = _Handover.open()
            self.handover().record((self.params[i - self.num_tensors] for i in group.inputs
                                    if i >= self.num_tensors), self.plan.copy_grads)
        return _unalias(grads)


class EngineFunction(torch.autograd.Function):
    """The engine's forward; in backward it binds the output gradients and runs nothing else."""

    @staticmethod
    def forward(ctx, state: _Backward, inputs: list, carrier):
        with python_op.errors_as_raised():
            outputs, run_ctx = state.engine.forward(inputs)
        # An output that is an input (a returned parameter or pass-through tensor) or a view of
        # one must come out as a new tensor: autograd does not see `inputs` (they enter through
        # the Release nodes) and would otherwise give a leaf parameter this node as its grad_fn.
        outputs = [o.detach() if _compat.is_view(o) or any(o is t for t in inputs) else o for o in outputs]
        ctx.state, ctx.device = state, carrier.device
        # An output nobody differentiated gets None, not a filled zero tensor of its size (a GPT's
        # logits returned beside the loss: 200 MB); the engine uses a stride-0 zero view instead.
        ctx.set_materialize_grads(False)
        state.run_ctx = run_ctx  # holds only the saved set; freed by backward or with ctx
        frozen = [o for o, diff in zip(outputs, state.engine.output_differentiable) if not diff]
        if frozen:
            ctx.mark_non_differentiable(*frozen)
        return tuple(outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grad_outputs):
        ctx.state.begin(grad_outputs)
        return None, None, torch.empty(0, device=ctx.device)


class Release(torch.autograd.Function):
    """Group k's inputs enter autograd here; its backward hands over their gradients."""

    @staticmethod
    def forward(ctx, state: _Backward, k: int, device, carrier, *tensors):
        ctx.state, ctx.k, ctx.chained = state, k, carrier is not None
        # Carriers live on the engine's device, so autograd runs these nodes where (and on the
        # stream) the engine's backward runs, as it ran the single node before.
        return torch.empty(0, device=device)

    @staticmethod
    @once_differentiable
    def backward(ctx, carrier_grad):
        grads = ctx.state.take(ctx.k)
        return (None, None, None, torch.empty(0, device=carrier_grad.device) if ctx.chained else None, *grads)


def run_training(engine, report, plan: ReleasePlan, tensors: list, params: list) -> tuple:
    """The outputs of a training call, wired to autograd through the release chain."""
    inputs = [*tensors, *params]
    device = inputs[0].device if inputs else torch.device("cpu")
    state = _Backward(engine, report, plan, params, len(tensors))
    carrier = None
    for k in reversed(range(len(plan.groups))):  # the last group to hand over is the first node
        carrier = Release.apply(state, k, device, carrier, *[inputs[i] for i in plan.groups[k].inputs])
    return EngineFunction.apply(state, inputs, carrier)


def _unalias(grads):
    """Two inputs of one group may receive the very same gradient tensor (e.g. both operands of
    an Add); autograd must never store one tensor as two parameters' .grad. (Across groups the
    engine hands the earlier one a copy.)"""
    seen = set()
    out = []
    for g in grads:
        if g is not None and g.layout == torch.strided:  # sparse gradients (ATen fallback) own theirs
            key = (g.data_ptr(), g.storage_offset(), tuple(g.shape), tuple(g.stride()))
            if g.numel() and key in seen:
                g = g.clone()
            seen.add(key)
        out.append(g)
    return out
