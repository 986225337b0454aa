"""Host values per input-shape signature (csrc/runtime/host_cache.h): the shape arithmetic on the
host runs on the first step of each input shape and is taken from the engine's cache afterwards,
with losses and gradients equal to eager PyTorch; what depends on data is never reused."""
import copy

import torch
from onnx import TensorProto, helper

import model_zoo
from torch_ort import ORTModule, _C

HOST_STEPS = ("host_steps_forward", "host_steps_backward",
              "host_steps_cached_forward", "host_steps_cached_backward")


def _counts(model):
    stats = model.stats()
    return tuple(stats[k] for k in HOST_STEPS)


def test_shape_work_runs_once_per_sequence_length_and_matches_eager():
    torch.manual_seed(0)
    eager = model_zoo.nanogpt()
    model = ORTModule(copy.deepcopy(eager))
    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    counts = []
    for k, seq in enumerate((16, 16, 24, 16)):
        (idx, tgt), _ = model_zoo.nanogpt_batch(2, seq, torch.Generator().manual_seed(k))
        losses = []
        for m, o in ((eager, opt_eager), (model, opt)):
            o.zero_grad()
            loss = m(idx, tgt)[1]
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
        opt_eager.step()
        opt.step()
        counts.append(_counts(model))
    first, steady, new_length, back = counts
    # Backward reads the shapes forward computed (autodiff emits its Shape reads on forward's
    # side), so it runs no host step of its own, cached or not.
    ran_fwd, ran_bwd = first[0], first[1]
    assert ran_fwd > 0 and ran_bwd >= 0 and first[2:] == (0, 0), counts
    assert steady == (0, 0, ran_fwd, ran_bwd), counts  # everything from the cache
    assert new_length == first, counts                 # a new signature computes them again
    assert back == steady, counts                      # and the first one is still held
    assert model._last_engine.host_cache_size == 2


def _engine(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    return _C.Engine(model.SerializeToString(), False, [False] * len(inputs))


def test_a_size_that_depends_on_an_input_value_is_never_reused():
    """y = x.reshape(len(range(n)), -1): the input sizes are the same every call, but Shape reads
    a tensor whose size is the value of `n` (a host-read scalar input): its guard fails whenever n
    differs from the recorded call's, and the shape arithmetic runs again."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Range", ["zero", "n", "one"], ["r"], name="range"),
             helper.make_node("Shape", ["r"], ["s"], name="shape"),
             helper.make_node("Concat", ["s", "minus_one"], ["t"], axis=0, name="concat"),
             helper.make_node("Reshape", ["x", "t"], ["y"], name="reshape")]
    inits = [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
             helper.make_tensor("one", TensorProto.INT64, [], [1]),
             helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1])]
    engine = _engine(nodes, [vi("x", TensorProto.FLOAT, [12]), vi("n", TensorProto.INT64, [])],
                     [vi("y", TensorProto.FLOAT, ["a", "b"])], inits)
    assert engine.stats()["host_cacheable_forward"] == 2  # Shape (guarded) and Concat
    x = torch.arange(12.0)
    ran = []
    for n in (3, 4, 3, 6, 3):
        (y,), _ = engine.forward([x, torch.tensor(n)])
        assert torch.equal(y, x.reshape(n, -1)), n
        assert engine.last_host_reads_forward == 1  # n is read every call, never cached
        ran.append((engine.last_host_steps_forward, engine.last_host_steps_cached_forward))
    assert ran == [(2, 0), (2, 0), (0, 2), (2, 0), (0, 2)]
    assert engine.host_cache_size == 1  # one signature: the sizes never changed


def test_the_cache_holds_a_few_signatures_only():
    """y = x.reshape(1, -1) for ten lengths: each new length computes its shape once, and the cache
    keeps the most recent signatures, not one per length ever seen."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Concat", ["one", "s"], ["t"], axis=0, name="concat"),
             helper.make_node("Reshape", ["x", "t"], ["y"], name="reshape")]
    engine = _engine(nodes, [vi("x", TensorProto.FLOAT, ["n"])], [vi("y", TensorProto.FLOAT, [1, "n"])],
                     [helper.make_tensor("one", TensorProto.INT64, [1], [1])])
    ran = []
    for n in list(range(1, 11)) + [10, 1]:
        x = torch.randn(n)
        (y,), _ = engine.forward([x])
        assert torch.equal(y, x.reshape(1, n))
        ran.append((engine.last_host_steps_forward, engine.last_host_steps_cached_forward))
    # 10 is recent (cached); 1 was evicted by the eight lengths after it (computed again).
    assert ran == [(2, 0)] * 10 + [(0, 2), (2, 0)]
    assert engine.host_cache_size == 8


def test_a_cached_host_value_is_never_written_in_place():
    """y = x·numel(x), z = arange(numel(x)·2.0): the host Mul is the last reader of numel(x) and
    may take its buffer over; the cache must still hand out the unchanged value on later calls."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Size", ["x"], ["n"], name="size"),
             helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Mul", ["x", "nf"], ["y"], name="scale"),
             helper.make_node("Mul", ["nf", "two"], ["d"], name="double"),
             helper.make_node("Range", ["zero", "d", "one"], ["z"], name="range")]
    inits = [helper.make_tensor(name, TensorProto.FLOAT, [], [v])
             for name, v in (("two", 2.0), ("zero", 0.0), ("one", 1.0))]
    engine = _engine(nodes, [vi("x", TensorProto.FLOAT, ["b", 3])],
                     [vi("y", TensorProto.FLOAT, ["b", 3]), vi("z", TensorProto.FLOAT, ["m"])], inits)
    assert engine.stats()["host_cacheable_forward"] == 3  # Size, Cast, Mul on the host
    for b in (2, 2, 5, 2, 5):
        x = torch.randn(b, 3)
        (y, z), _ = engine.forward([x])
        assert torch.equal(y, x * float(x.numel())), b
        assert torch.equal(z, torch.arange(2.0 * x.numel())), b
    assert engine.last_host_steps_cached_forward == 3
