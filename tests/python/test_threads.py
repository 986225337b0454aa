"""Threads: one ORTModule serving inference from several threads (first call racing, different
batch sizes, different schemas racing) matches eager and exports each schema once; two ORTModules
training in two threads (a PythonOp in each, first exports racing) match the same runs done one
after the other; an export in one thread never changes how torch.autograd.Function or
torch.utils.checkpoint behave in another. Barriers start the threads together; every join has a
timeout, so a deadlock fails instead of hanging."""
import copy
import logging
import sys
import threading
import warnings

import pytest
import torch
import torch.utils.checkpoint

from torch_ort import ORTModule
from torch_ort.ortmodule.export import python_op

TIMEOUT = 120  # seconds a thread may take (exports on 2 shared cores are slow)


def run_threads(target, n):
    """Runs target(i) in n threads started together; re-raises the first thread's error."""
    barrier = threading.Barrier(n, timeout=TIMEOUT)
    errors, results = [], [None] * n

    def body(i):
        try:
            barrier.wait()
            results[i] = target(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a thread did not finish (deadlock?)"
    if errors:
        raise errors[0]
    return results


class Scale(torch.autograd.Function):
    """A PythonOp: x * s with a non-tensor argument and its own backward."""

    @staticmethod
    def forward(ctx, x, s):
        ctx.s = s
        return x * s

    @staticmethod
    def backward(ctx, g):
        return g * ctx.s, None


class Net(torch.nn.Module):
    def __init__(self, d=8, hidden=16, out=4, python_op=False):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, hidden)
        self.fc2 = torch.nn.Linear(hidden, out)
        self.python_op = python_op

    def forward(self, x, shift: float = 0.0):
        h = torch.tanh(self.fc1(x))
        if self.python_op:
            h = Scale.apply(h, 0.5)
        return self.fc2(h) + shift


# --- inference from many threads through one module -------------------------------------------
@pytest.mark.parametrize("mode", ["eval", "train_no_grad"])
def test_inference_from_threads_matches_eager_and_exports_once(strict, mode):
    torch.manual_seed(0)
    eager = Net()
    ours = ORTModule(copy.deepcopy(eager))
    if mode == "eval":
        eager.eval()
        ours.eval()
    n, rounds = 6, 4
    batches = [[torch.randn(1 + (i + r) % 5, 8) for r in range(rounds)] for i in range(n)]
    with torch.no_grad():
        expected = [[eager(x) for x in row] for row in batches]

    def work(i):
        with torch.no_grad():  # grad mode is per thread
            return [ours(x) for x in batches[i]]

    got = run_threads(work, n)  # the first call (the export) races in every thread
    for want_row, got_row in zip(expected, got):
        for want, out in zip(want_row, got_row):
            torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    assert ours.export_count == 1
    assert ours.engine_build_count == 1


class Meet(torch.autograd.Function):
    """Identity whose forward, once `barrier` is set, waits until every party is inside it."""

    barrier = None

    @staticmethod
    def forward(ctx, x):
        if Meet.barrier is not None:
            Meet.barrier.wait()
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g


class MeetNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return Meet.apply(self.fc(x))


def test_engine_calls_run_at_the_same_time(strict, monkeypatch):
    """Two inference calls are inside the engine at once: no lock is held while it runs (the
    PythonOp in the graph waits for the other call; a serialised engine would time out)."""
    ours = ORTModule(MeetNet()).eval()
    x = torch.randn(2, 4)
    with torch.no_grad():
        want = ours(x)  # exports and builds, unsynchronised
    monkeypatch.setattr(Meet, "barrier", threading.Barrier(2, timeout=20))

    def work(i):
        with torch.no_grad():
            return ours(x)

    for out in run_threads(work, 2):
        assert torch.equal(out, want)


def test_different_schemas_racing_each_export_once(strict):
    torch.manual_seed(0)
    eager = Net().eval()
    ours = ORTModule(copy.deepcopy(eager)).eval()
    # Three schemas: rank 2, rank 3, and a different non-tensor argument; two threads each.
    calls = [((torch.randn(3, 8),), {}), ((torch.randn(2, 3, 8),), {}),
             ((torch.randn(3, 8),), {"shift": 1.5})]
    n = 2 * len(calls)
    with torch.no_grad():
        expected = [eager(*calls[i % 3][0], **calls[i % 3][1]) for i in range(n)]

    def work(i):
        args, kwargs = calls[i % 3]
        return [ours(*args, **kwargs) for _ in range(3)]

    got = run_threads(work, n)
    for want, outs in zip(expected, got):
        for out in outs:
            torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    assert ours.export_count == len(calls)
    assert len(ours._plan_cache) == len(calls)


# --- training in two threads, one module each -----------------------------------------------
def process_wide_state():
    loggers = ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")
    return (sys.stderr, list(warnings.filters), [logging.getLogger(n).level for n in loggers],
            torch.autograd.Function.__dict__["apply"], torch.utils.checkpoint.checkpoint,
            getattr(torch.utils.checkpoint, "_checkpoint_impl", None))


def train(model, seed, steps=4):
    """(losses, final parameters) of a few SGD steps on data drawn from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(5, 8, generator=gen), torch.randn(5, 4, generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses), [p.detach().clone() for p in model.parameters()]


def test_two_modules_training_in_two_threads_do_not_interfere(strict):
    torch.manual_seed(0)
    base = Net(python_op=True)
    # Alone, one after the other: the reference.
    alone = [train(ORTModule(copy.deepcopy(base)), seed) for seed in (1, 2)]
    eager = train(copy.deepcopy(base), 1)
    torch.testing.assert_close(alone[0][0], eager[0], rtol=1e-5, atol=1e-7)

    modules = [ORTModule(copy.deepcopy(base)) for _ in range(2)]
    process_state = process_wide_state()
    together = run_threads(lambda i: train(modules[i], i + 1), 2)  # exports race
    # An export quiets the exporter (logger levels, warnings filters, stderr) and restores them:
    # two exports overlapping must not leave the process quieted.
    assert process_wide_state() == process_state
    for (losses, params), (want_losses, want_params) in zip(together, alone):
        assert torch.equal(losses, want_losses)
        for p, q in zip(params, want_params):
            assert torch.equal(p, q)
    for m in modules:
        assert m.export_count == 1
        assert m._plan_cache and all(r.export.python_ops for r in m._plan_cache.runners())


# --- an export in one thread, eager autograd in another ---------------------------------------
class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 3  # deliberately not the derivative: shows this backward ran


class Rendezvous(torch.nn.Module):
    """Its forward (run only while ORTModule exports it) lets the other thread run, and waits."""

    def __init__(self, exporting: threading.Event, other_done: threading.Event):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.events = (exporting, other_done)

    def forward(self, x):
        exporting, other_done = self.events
        if not other_done.is_set():
            exporting.set()
            other_done.wait(TIMEOUT)
        return Scale.apply(self.fc(x), 2.0)


def test_export_in_one_thread_does_not_change_eager_functions_in_another(strict, capfd):
    exporting, other_done = threading.Event(), threading.Event()
    ours = ORTModule(Rendezvous(exporting, other_done))
    sites_before = set(python_op._SITES)

    def eager_work():
        assert exporting.wait(TIMEOUT), "the export did not start"
        try:
            x = torch.randn(3, requires_grad=True)
            y = Double.apply(x)  # the export's Function.apply patch must not apply here
            assert type(y.grad_fn).__name__ == "DoubleBackward"
            y.sum().backward()
            assert torch.equal(x.grad, torch.full_like(x, 3.0))
            # Nor its torch.utils.checkpoint patch (which refuses checkpoint unless allowed).
            w = torch.randn(3, requires_grad=True)
            z = torch.utils.checkpoint.checkpoint(lambda a: (a * w).sin(), x, use_reentrant=False)
            z.sum().backward()
            torch.testing.assert_close(w.grad, x.detach() * x.detach().mul(w.detach()).cos())
            # Nor does its stderr capture take this thread's output.
            print("a line from the other thread", file=sys.stderr)
            return set(python_op._SITES) - sites_before
        finally:
            other_done.set()

    def work(i):
        if i == 0:
            return ours(torch.randn(2, 4)).sum().item()
        return eager_work()

    _, new_sites = run_threads(work, 2)
    assert exporting.is_set() and ours.export_count == 1
    # Only the export's own Function call was registered, none of the other thread's.
    assert {python_op.registered(i).function for i in new_sites} <= {Scale}
    assert "a line from the other thread" in capfd.readouterr().err
