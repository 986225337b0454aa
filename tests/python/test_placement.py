"""Host values (csrc/core/planner/placement.h) through the engine: a steady-state training step of
every zoo model reads nothing back from the device (model.stats(), counted on the CPU as if the
values lived on a device), what does cross is counted and still computes the right values, and
the executed graph shows where host values are."""
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import model_zoo
from test_cnn import SmallCNN
from test_cnn import batch as cnn_batch
from torch_ort import ORTModule, _C

TRANSFERS = ("to_host_forward", "to_host_backward", "to_device_forward", "to_device_backward")


def steps(model, make_batch, n=3):
    for k in range(n):
        args, kwargs = make_batch(k)
        _loss(model(*args, **kwargs)).backward()
        yield model.stats()


def _loss(out):
    if isinstance(out, tuple):  # nanoGPT (logits, loss); SmallCNN (loss, logits)
        return out[1] if out[1].dim() == 0 else out[0]
    return model_zoo.loss_of(out)


@pytest.mark.parametrize("name", sorted(model_zoo.ZOO))
def test_zoo_steps_read_nothing_from_the_device(strict, name):
    factory, make = model_zoo.ZOO[name]
    model = ORTModule(factory(dropout=0.1))  # dropout: its ratio and training flag are host values
    for stats in steps(model, lambda k: make(2, 16, torch.Generator().manual_seed(k))):
        assert stats["host_reads_forward"] == 0, stats
        assert stats["host_reads_backward"] == 0, stats
        assert all(stats["host_transfers"][k] == 0 for k in TRANSFERS), stats


def test_cnn_steps_read_nothing_from_the_device(strict):
    model = ORTModule(SmallCNN())
    gen = torch.Generator().manual_seed(0)
    for stats in steps(model, lambda k: (cnn_batch(gen, 4), {})):
        assert (stats["host_reads_forward"], stats["host_reads_backward"]) == (0, 0), stats


def test_shape_arithmetic_lives_on_the_host(strict):
    """nanoGPT's Shape → Gather → Concat chains feeding Reshape are host values; its activations
    are not."""
    model = ORTModule(model_zoo.nanogpt())
    idx, tgt = model_zoo.nanogpt_batch(2, 16, torch.Generator().manual_seed(0))[0]
    model(idx, tgt)[1].backward()
    engine = model._last_engine
    host = set(engine.host_values())
    graph = onnx.load_from_string(engine.training_graph_onnx()).graph
    shapes = [n.output[0] for n in graph.node if n.op_type == "Shape"]
    assert shapes and set(shapes) <= host
    reshaped = [n for n in graph.node if n.op_type == "Reshape"]
    assert all(n.input[1] in host for n in reshaped)  # every target shape, of data or of shapes
    assert any(n.input[0] not in host for n in reshaped)
    assert engine.stats()["host_nodes"] >= len(shapes)
    assert not any(n.op_type in ("ToHost", "ToDevice") for n in graph.node)


def _engine(nodes, inputs, outputs, inits=(), training=False, flags=None):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    return _C.Engine(model.SerializeToString(), training, flags or [False] * len(inputs))


def test_a_shape_from_the_callers_tensor_is_one_counted_read():
    vi = helper.make_tensor_value_info
    engine = _engine([helper.make_node("Reshape", ["x", "s"], ["y"], name="r")],
                     [vi("x", TensorProto.FLOAT, [2, 6]), vi("s", TensorProto.INT64, [2])],
                     [vi("y", TensorProto.FLOAT, [3, 4])], training=True, flags=[True, False])
    assert engine.stats()["to_host_forward"] == 1 and engine.stats()["to_host_backward"] == 0
    x = torch.randn(2, 6)
    for _ in range(2):
        (y,), ctx = engine.forward([x, torch.tensor([3, 4])])
        assert torch.equal(y, x.reshape(3, 4))
        assert engine.last_host_reads_forward == 1 and ctx.host_reads == 1
        dx, _ = engine.backward(ctx, [torch.ones(3, 4)])
        assert engine.last_host_reads_backward == 0
        assert torch.equal(dx, torch.ones(2, 6))


def test_a_host_value_read_as_data_is_uploaded_once_per_value():
    """y = x · numel(x): Size is a host value that Mul reads as data (one ToDevice, no read)."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Size", ["x"], ["n"], name="size"),
             helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Mul", ["x", "nf"], ["y"], name="mul")]
    engine = _engine(nodes, [vi("x", TensorProto.FLOAT, ["b", 3])], [vi("y", TensorProto.FLOAT, ["b", 3])])
    assert engine.stats()["to_device_forward"] == 1
    for b in (2, 5, 2):
        x = torch.randn(b, 3)
        (y,), _ = engine.forward([x])
        assert torch.equal(y, x * float(x.numel()))
        assert engine.last_host_reads_forward == 0
    assert {"n", "nf"} <= set(engine.host_values())
