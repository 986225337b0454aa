"""Limits on model input (csrc/core/ir/limits.h): hostile ONNX bytes handed to the engine raise the
bound error type with a message that names the limit, never crash or allocate without bound."""
import warnings

import pytest
import torch
from onnx import TensorProto, helper

from torch_ort import ORTModule
from torch_ort import _C
from torch_ort.ortmodule import ORTModuleONNXModelException

KMAX_NODES = 1_000_000
KMAX_RANK = 64
KMAX_DIM = 1 << 48


def identity_model(**changes):
    """y = Identity(x), x: float [2]; keyword arguments replace parts of the graph."""
    parts = dict(
        nodes=[helper.make_node("Identity", ["x"], ["y"], name="/id")],
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[],
    )
    parts.update(changes)
    graph = helper.make_graph(parts["nodes"], "limits", parts["inputs"], parts["outputs"],
                              initializer=parts["initializer"])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def tensor(name, data_type, dims, raw=None, int64s=None):
    """A TensorProto as the bytes say, without onnx.helper's own consistency checks."""
    t = TensorProto(name=name, data_type=data_type, dims=dims)
    if raw is not None:
        t.raw_data = raw
    if int64s is not None:
        t.int64_data.extend(int64s)
    return t


def engine(model_or_bytes):
    data = model_or_bytes if isinstance(model_or_bytes, bytes) else model_or_bytes.SerializeToString()
    return _C.Engine(data, False, [False])


def test_a_valid_model_loads():
    engine(identity_model())


def test_node_count():
    # A million empty nodes appended in wire format (field 7 = graph, field 1 = node): a repeated
    # embedded message seen again is merged by the parser. 2 MB of bytes, no Python loop over protos.
    extra = b"\x0a\x00" * (KMAX_NODES + 1)
    size = len(extra)
    varint = bytearray()
    while size >= 0x80:
        varint.append((size & 0x7F) | 0x80)
        size >>= 7
    varint.append(size)
    data = identity_model().SerializeToString() + b"\x3a" + bytes(varint) + extra
    with pytest.raises(_C.OnnxImportError, match=r"1000002, over the limit kMaxNodes = 1000000"):
        engine(data)


def test_rank():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1] * (KMAX_RANK + 1))
    with pytest.raises(_C.OnnxImportError, match=r"value 'x' has rank 65, over the limit kMaxRank"):
        engine(identity_model(inputs=[x]))


def test_dim():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [KMAX_DIM + 1])
    with pytest.raises(_C.OnnxImportError, match=r"value 'x'.*over the limit kMaxDim"):
        engine(identity_model(inputs=[x]))


def test_initializer_whose_element_count_wraps():
    # 2^32 x 2^32 elements wrap to 0 in int64, which an empty raw_data would have matched.
    w = tensor("w", TensorProto.FLOAT, [1 << 32, 1 << 32], raw=b"")
    with pytest.raises(_C.OnnxImportError, match=r"initializer 'w'.*kMaxElements"):
        engine(identity_model(initializer=[w]))


def test_raw_data_length_must_match():
    w = tensor("w", TensorProto.FLOAT, [2], raw=b"\x00" * 7)
    with pytest.raises(_C.OnnxImportError,
                       match=r"initializer 'w' has 7 bytes of raw_data, expected 8 for float32 \[2\]"):
        engine(identity_model(initializer=[w]))


def test_typed_field_count_must_match():
    w = tensor("w", TensorProto.INT64, [2], int64s=[1, 2, 3])
    with pytest.raises(_C.OnnxImportError,
                       match=r"initializer 'w' has 3 values in int64_data, expected 2"):
        engine(identity_model(initializer=[w]))


def test_per_axis_attribute_length():
    node = helper.make_node("Transpose", ["x"], ["y"], name="/t", perm=list(range(129)))
    with pytest.raises(_C.OnnxImportError,
                       match=r"attribute 'perm' of node Transpose \(node /t\).*kMaxShapeAttributeElements"):
        engine(identity_model(nodes=[node]))


def test_attribute_string_bytes():
    node = helper.make_node("Identity", ["x"], ["y"], name="/id", note="x" * ((1 << 20) + 1))
    with pytest.raises(_C.OnnxImportError, match=r"attribute 'note'.*kMaxAttributeStringBytes"):
        engine(identity_model(nodes=[node]))


def test_inferred_shape_from_constants():
    # Expand to [2^40, 2^40]: the model's own shapes are fine, the one it computes is not.
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1 << 40, 1 << 40])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    node = helper.make_node("Expand", ["x", "shape"], ["y"], name="/expand")
    with pytest.raises(_C.VerifyError, match=r"Expand \(node /expand\).*kMaxElements"):
        engine(identity_model(nodes=[node], inputs=[x], initializer=[shape]))


def test_symbolic_size_overflow_at_run_time():
    # y = Neg(x), x: float64 [s, 2^48]: the memory estimate is 2^51·s bytes; with s = 2^13 that is
    # 2^64, which must raise (naming the formula and the binding), not wrap.
    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["s", KMAX_DIM])
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["s", KMAX_DIM])
    node = helper.make_node("Neg", ["x"], ["y"], name="/neg")
    e = engine(identity_model(nodes=[node], inputs=[x], outputs=[y]))
    assert e.memory_report([[2, KMAX_DIM]])["predicted"]["forward_peak"] == 2 * 8 * KMAX_DIM
    with pytest.raises(OverflowError, match=r"overflows int64 when evaluated with s=8192"):
        e.memory_report([[1 << 13, KMAX_DIM]])


class HugeExpand(torch.nn.Module):
    """Eager takes a view of 2^50 elements and reads 4 of them; the engine refuses the shape."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        big = x[:1, :1].expand(1 << 25, 1 << 25)
        return self.fc(x + big[:1, :4].sum())


def test_ortmodule_raises_naming_the_limit(strict):
    with pytest.raises(ORTModuleONNXModelException, match="kMaxElements"):
        ORTModule(HugeExpand())(torch.randn(2, 4))


@pytest.mark.fallback
def test_ortmodule_falls_back_with_the_limit_in_the_warning():
    model, x = HugeExpand(), torch.randn(2, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = ORTModule(model)(x)
    assert any("kMaxElements" in str(w.message) for w in caught), [str(w.message) for w in caught]
    torch.testing.assert_close(out, model(x))  # eager ran it
