"""ORTMODULE_USE_CUDA_GRAPH's logic (torch_ort/ortmodule/engine/cuda_graph.py), on the CPU: a stand-in
backend whose replay re-runs the captured call into the same tensors, as a CUDA graph's replay
writes the same addresses. What it checks: when a step is captured and replayed, that replays read
the inputs copied in and the live parameters and write the static buffers, and the cases that must
not replay (a second forward in flight, moved parameters, a new shape, host reads, PythonOp).
The real capture runs in tests/python/test_gpu*.py on a GPU."""
import copy

import pytest
import torch

import model_zoo
from test_threads import Scale  # a PythonOp: x * s with its own backward
from torch_ort import ORTModule
from torch_ort.ortmodule.engine import cuda_graph


class _Rerun:
    def __init__(self, fn, result):
        self.fn, self.result = fn, result

    def replay(self):
        for dst, src in zip(self.result, self.fn()):
            if dst is not None:
                dst.copy_(src)


class RerunBackend:
    """CUDA graphs stand-in: capture runs the call once, a replay runs it again into its results."""

    captures = 0

    def applies(self, inputs):
        return True

    def new_pool(self):
        return None

    def rng_state(self):
        return torch.get_rng_state()

    def set_rng_state(self, state):
        torch.set_rng_state(state)

    def warm_up(self, fn):
        fn()

    def capture(self, fn, pool):
        RerunBackend.captures += 1
        result = fn()
        return _Rerun(fn, result), result


@pytest.fixture
def graphs(strict, monkeypatch):
    monkeypatch.setenv("ORTMODULE_USE_CUDA_GRAPH", "1")
    monkeypatch.setattr(cuda_graph, "CudaGraphBackend", RerunBackend)


def gpt_batch(b, t, seed):
    data = torch.randint(1, model_zoo.VOCAB, (b, t + 1), generator=torch.Generator().manual_seed(seed))
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def train(model, batches, accumulate=1, opt=None):
    """Losses and final parameters of SGD steps (in place, as every torch optimizer updates)."""
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for k, (idx, tgt) in enumerate(batches):
        loss = model(idx, tgt)[1]
        (loss / accumulate).backward()
        losses.append(loss.item())
        if (k + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return losses, [p.detach().clone() for p in model.parameters()]


def pair(dropout=0.1):
    torch.manual_seed(0)
    eager = model_zoo.NanoGPT(dropout=dropout)
    return eager, copy.deepcopy(eager)


def test_replays_match_uncaptured_steps_with_dropout(graphs, monkeypatch):
    eager, graphed = pair()
    batches = [gpt_batch(4, 16, s) for s in range(6)]
    model = ORTModule(graphed)
    torch.manual_seed(1)
    got, params = train(model, batches)
    stats = model.stats()
    assert stats["cuda_graph_captures"] == 1
    assert stats["cuda_graph_replays"] == len(batches) - cuda_graph.WARMUP
    monkeypatch.setenv("ORTMODULE_USE_CUDA_GRAPH", "0")
    plain = ORTModule(copy.deepcopy(eager))
    torch.manual_seed(1)
    want, want_params = train(plain, batches)
    assert got == want  # the same kernels on the same inputs, the same random draws: bitwise
    for p, q in zip(params, want_params):
        assert torch.equal(p, q)
    torch.manual_seed(1)
    ref, ref_params = train(eager, batches)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-5, atol=1e-5)
    for p, q in zip(params, ref_params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_gradient_accumulation_and_a_second_forward_in_flight(graphs):
    eager, graphed = pair(dropout=0.0)
    model = ORTModule(graphed)
    batches = [gpt_batch(2, 8, s) for s in range(8)]
    got, params = train(model, batches, accumulate=2)
    want, want_params = train(eager, batches, accumulate=2)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5)
    for p, q in zip(params, want_params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    # Two forwards before one backward: the second must not overwrite the first's activations.
    replays = model.stats()["cuda_graph_replays"]
    (a, b), (c, d) = gpt_batch(2, 8, 100), gpt_batch(2, 8, 101)
    la, lb = model(a, b)[1], model(c, d)[1]
    assert model.stats()["cuda_graph_replays"] == replays + 1  # the second ran uncaptured
    (la + lb).backward()
    ea, eb = eager(a, b)[1], eager(c, d)[1]
    (ea + eb).backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


def test_a_new_shape_captures_again_and_moved_parameters_recapture(graphs):
    eager, graphed = pair(dropout=0.0)
    model = ORTModule(graphed)
    batches = [gpt_batch(2, 8, s) for s in range(4)] + [gpt_batch(2, 12, s) for s in range(4)]
    got, _ = train(model, batches)
    want, _ = train(eager, batches)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5)
    assert model.stats()["cuda_graph_captures"] == 2
    # Parameters given new storage (not in place): the capture is dropped, never replayed stale.
    for p, q in zip(model.parameters(), eager.parameters()):
        p.data = p.data.clone()
    more = [gpt_batch(2, 12, s) for s in range(10, 14)]
    got, params = train(model, more)
    want, want_params = train(eager, more)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5)
    for p, q in zip(params, want_params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert model.stats()["cuda_graph_captures"] == 3


def test_outputs_are_the_replay_buffers_and_stale_ones_fail_loudly(graphs):
    """No copy out: two replays return the same memory; the older output, read after the next
    replay, raises instead of showing the newer values; a clone() of it stays valid."""
    _, graphed = pair(dropout=0.0)
    model = ORTModule(graphed)
    for s in range(3):  # warm-up and capture
        model(*gpt_batch(2, 8, s))[1].backward()
    logits, loss = model(*gpt_batch(2, 8, 10))
    loss.backward()
    kept, address = logits.detach().clone(), logits.data_ptr()
    old_loss = loss.item()
    replays = model.stats()["cuda_graph_replays"]
    logits2, loss2 = model(*gpt_batch(2, 8, 11))
    assert model.stats()["cuda_graph_replays"] == replays + 1
    assert logits2.data_ptr() == address  # the same buffer: nothing was cloned
    with pytest.raises(RuntimeError, match="overwritten by a later replay"):
        logits.sum()
    with pytest.raises(RuntimeError, match="overwritten by a later replay"):
        loss.item()
    assert not torch.equal(kept, logits2.detach())  # a different batch: the buffer did change
    eager = copy.deepcopy(model.module)
    torch.testing.assert_close(eager(*gpt_batch(2, 8, 10))[1].item(), old_loss, rtol=1e-5, atol=1e-6)
    loss2.backward()


def test_a_kept_alias_of_an_output_keeps_its_values_and_runs_uncaptured(graphs, torch_ort_log):
    _, graphed = pair(dropout=0.0)
    model = ORTModule(graphed)
    for s in range(3):
        model(*gpt_batch(2, 8, s))[1].backward()
    logits, loss = model(*gpt_batch(2, 8, 10))
    loss.backward()
    alias, value = loss.detach(), loss.item()  # detach() shares the buffer: it cannot be invalidated
    replays = model.stats()["cuda_graph_replays"]
    for s in range(2):
        model(*gpt_batch(2, 8, 20 + s))[1].backward()
    assert model.stats()["cuda_graph_replays"] == replays  # ran uncaptured: the alias is intact
    assert alias.item() == value
    assert any("calls run uncaptured while it is" in r.getMessage() for r in torch_ort_log)
    del alias, logits, loss
    model(*gpt_batch(2, 8, 30))[1].backward()
    assert model.stats()["cuda_graph_replays"] == replays + 1  # the alias is gone: replays again


def grads_of(model):
    return [p.grad for p in model.parameters()]


def assert_grads_like(model, eager, idx, tgt):
    eager.zero_grad(set_to_none=True)
    eager(idx, tgt)[1].backward()
    for g, p in zip(grads_of(model), eager.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)


def test_gradients_are_adopted_without_a_copy(graphs):
    """.grad of a replayed backward is the graph's buffer (autograd adopted it): the same address
    every step, and the same values as eager."""
    eager, graphed = pair(dropout=0.0)
    model = ORTModule(graphed)
    for s in range(3):
        model(*gpt_batch(2, 8, s))[1].backward()
        model.zero_grad(set_to_none=True)
    addresses = []
    for s in range(3):
        idx, tgt = gpt_batch(2, 8, 10 + s)
        model(idx, tgt)[1].backward()
        addresses.append([g.data_ptr() for g in grads_of(model)])
        # A copy would own its storage (2 references: itself and the storage object asked for).
        assert all(cuda_graph.storage_refs(g) > 2 for g in grads_of(model))
        assert_grads_like(model, eager, idx, tgt)
        model.zero_grad(set_to_none=True)
    assert addresses[0] == addresses[1] == addresses[2]
    assert model.stats()["cuda_graph_replays"] == 4  # the capture's and these three


def train_keeping_grads(model, set_to_none, steps=6):
    """SGD steps that keep every step's first .grad tensor object (values read at the end)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept, replays = [], []
    for s in range(steps):
        model(*gpt_batch(2, 8, s))[1].backward()
        opt.step()
        kept.append(next(model.parameters()).grad)
        opt.zero_grad(set_to_none=set_to_none)
        if isinstance(model, ORTModule):
            replays.append(model.stats()["cuda_graph_replays"])
    return kept, replays, [p.detach().clone() for p in model.parameters()]


def test_zero_grad_without_none_keeps_grad_and_replays(graphs):
    """.grad stays on the buffer into the next call: it moves to its own memory, the same object,
    and every step still replays."""
    eager, graphed = pair(dropout=0.0)
    model = ORTModule(graphed)
    kept, replays, params = train_keeping_grads(model, set_to_none=False)
    want, _, want_params = train_keeping_grads(eager, set_to_none=False)
    assert all(b == a + 1 for a, b in zip(replays[2:], replays[3:])), replays
    assert kept[0] is kept[-1]  # one .grad object throughout, zeroed in place
    torch.testing.assert_close(kept[-1], want[-1], rtol=1e-4, atol=1e-6)
    for p, q in zip(params, want_params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


def test_a_grad_kept_after_zero_grad_keeps_its_values(graphs, torch_ort_log):
    """An earlier .grad the caller keeps after zero_grad(set_to_none=True) still holds the
    buffer: calls run uncaptured while it is alive, and it keeps its values."""
    eager, graphed = pair(dropout=0.0)
    model = ORTModule(graphed)
    kept, replays, params = train_keeping_grads(model, set_to_none=True)
    want, _, want_params = train_keeping_grads(eager, set_to_none=True)
    for a, b in zip(kept, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for p, q in zip(params, want_params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    assert replays[-1] == replays[2] == 1  # the capture's replay, then uncaptured steps
    assert any("a gradient of an earlier step" in r.getMessage() for r in torch_ort_log)
    del kept
    model(*gpt_batch(2, 8, 50))[1].backward()
    assert model.stats()["cuda_graph_replays"] == 2  # nothing holds the buffers: replays again


def test_a_call_that_runs_uncaptured_leaves_the_last_outputs_valid(graphs):
    """Only a replay overwrites the outputs it hands out: a call kept uncaptured (here by a .grad
    still on the gradient buffer) must not invalidate the last replay's outputs."""
    _, graphed = pair(dropout=0.0)
    model = ORTModule(graphed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in range(3):  # warm-up and capture
        model(*gpt_batch(2, 8, s))[1].backward()
        opt.zero_grad(set_to_none=True)
    logits, loss = model(*gpt_batch(2, 8, 10))  # a replay: its buffers
    loss.backward()
    replays, value = model.stats()["cuda_graph_replays"], logits.sum().item()
    kept = next(model.parameters()).grad  # holds the gradient buffer
    opt.zero_grad(set_to_none=True)
    model(*gpt_batch(2, 8, 11))[1].backward()
    assert model.stats()["cuda_graph_replays"] == replays  # uncaptured
    assert logits.sum().item() == value  # still readable, unchanged
    del kept


def test_without_buffer_tracking_outputs_are_copies(graphs, monkeypatch):
    """A torch without the private storage APIs: outputs cloned, gradients copied (as before)."""
    monkeypatch.setattr(cuda_graph, "tracks_buffers", lambda: False)
    _, graphed = pair(dropout=0.0)
    model = ORTModule(graphed)
    kept = []
    for s in range(5):
        logits, loss = model(*gpt_batch(2, 8, s))
        loss.backward()
        kept.append((logits.detach().clone(), logits))
    assert model.stats()["cuda_graph_replays"] >= 2
    for copy_then, live in kept:
        assert torch.equal(copy_then, live.detach())  # later replays did not write over it


def test_fewer_output_gradients_are_zeros_more_are_refused(graphs):
    _, graphed = pair(dropout=0.0)
    model = ORTModule(graphed)
    for s in range(4):  # warm up and replay with gradients through the logits and the loss
        logits, loss = model(*gpt_batch(2, 8, s))
        (loss + logits.float().square().mean()).backward()
    assert model.stats()["cuda_graph_replays"] >= 1
    model.zero_grad()
    idx, tgt = gpt_batch(2, 8, 9)
    model(idx, tgt)[1].backward()  # the loss only: the logits' gradient buffer gets zeros
    got = [p.grad.clone() for p in model.parameters()]
    eager = copy.deepcopy(model.module)
    eager.zero_grad()
    eager(idx, tgt)[1].backward()
    for g, p in zip(got, eager.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)

    _, graphed = pair(dropout=0.0)
    model = ORTModule(graphed)
    for s in range(4):
        model(*gpt_batch(2, 8, s))[1].backward()
    logits, loss = model(*gpt_batch(2, 8, 5))
    with pytest.raises(RuntimeError, match="ORTMODULE_USE_CUDA_GRAPH=1.*gradients for outputs"):
        (loss + logits.sum()).backward()


class WithFunction(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return Scale.apply(self.fc(x), 2.0).sum()


@pytest.mark.parametrize("model_cls", [WithFunction])
def test_steps_that_cannot_be_captured_run_uncaptured_with_a_warning(graphs, model_cls, torch_ort_log):
    model = ORTModule(model_cls())
    for _ in range(4):
        model(torch.randn(5, 4)).backward()
    assert model.stats()["cuda_graph_captures"] == 0
    assert any("runs without CUDA graphs" in r.getMessage() and "PythonOp" in r.getMessage()
               for r in torch_ort_log)


def test_host_reads_keep_a_step_uncaptured(graphs, torch_ort_log):
    """An engine whose warm-up steps read from the device is never captured."""
    import onnx
    from onnx import TensorProto, helper

    from torch_ort import _C

    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"], name="r")], "g",
                              [vi("x", TensorProto.FLOAT, [2, 6]), vi("s", TensorProto.INT64, [2])],
                              [vi("y", TensorProto.FLOAT, [3, 4])])
    engine = _C.Engine(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)],
                                         ir_version=10).SerializeToString(), True, [True, False])
    graphed = cuda_graph.GraphedEngine(engine, num_user=2, backend=RerunBackend())
    x, s = torch.randn(2, 6), torch.tensor([3, 4])
    for _ in range(4):
        (y,), ctx = graphed.forward([x, s])
        run = graphed.backward_begin(ctx, [torch.ones(3, 4)])
        (dx, _) = graphed.backward_take(run, -1, [0, 1])
        torch.testing.assert_close(dx, torch.ones(2, 6))
    assert engine.last_host_reads_forward == 1
    assert graphed.captures == 0
    assert any("read values back from the device" in r.getMessage() for r in torch_ort_log)
