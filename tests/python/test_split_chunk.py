"""chunk/split/unbind along an input dimension train like eager PyTorch. Along a dynamic dim the
exporter emits SplitToSequence + SequenceAt with a piece size known only at run time; the
sequence_to_split pass lowers those picks to Slice nodes (constant sizes: one Split). Each case:
forward outputs, parameter and input gradients and SGD steps against eager, with the input
alternating between two sizes of the dynamic dim so that one export serves both. float32
tolerances: rtol 1e-5, atol 1e-6."""

import onnx
import pytest
import torch
from onnx import TensorProto, helper

from conftest import twin
from torch_ort import ORTModule, _C

TOL = dict(rtol=1e-5, atol=1e-6)
SEQUENCE_OPS = {"SplitToSequence", "SequenceAt"}


class Pieces(torch.nn.Module):
    """Splits x·w + b by `split` (x -> the pieces used) and weighs each piece's loss by its own
    scalar, so every piece's gradient differs; returns the loss and the last piece used."""

    def __init__(self, split, d=8):
        super().__init__()
        self.split = split
        self.w, self.b = torch.nn.Parameter(torch.randn(d)), torch.nn.Parameter(torch.randn(d))
        self.c = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        pieces = self.split(x * self.w + self.b)
        loss = sum(self.c[i] * torch.tanh(p).pow(2).mean() for i, p in enumerate(pieces))
        return loss, pieces[-1]


class ChunkThenWeigh(torch.nn.Module):
    """The reported model: parameters applied after a chunk along dim 1."""

    def __init__(self):
        super().__init__()
        self.w1, self.w2 = torch.nn.Parameter(torch.randn(8)), torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        a, b = x.chunk(2, dim=1)          # x: (batch, 2*k, 8), dim 1 dynamic
        return (a * self.w1).sum() + (b * self.w2).mean()


def pick(*positions):
    return lambda pieces: [pieces[i] for i in positions]


# name -> (module factory, the two input shapes (the dynamic dim differs), the op the pieces
# become in the engine's forward graph)
CASES = {
    "chunk_example": (ChunkThenWeigh, [(3, 6, 8), (2, 10, 8)], "Slice"),
    "chunk2_dim1": (lambda: Pieces(lambda h: h.chunk(2, dim=1)), [(3, 6, 8), (2, 10, 8)], "Slice"),
    "split3_dim0_ragged": (lambda: Pieces(lambda h: torch.split(h, 3, dim=0)), [(7, 4, 8), (8, 4, 8)], "Slice"),
    "split_sizes_last_dim": (lambda: Pieces(lambda h: h.split([2, 5, 1], dim=-1)), [(3, 8), (5, 8)], "Split"),
    "chunk3_last_by_negative_index": (lambda: Pieces(lambda h: [h.chunk(3, 1)[-1]]), [(2, 7, 8), (2, 8, 8)], "Slice"),
    "chunk3_unequal_some_pieces": (lambda: Pieces(lambda h: pick(0, 2)(h.chunk(3, 1))), [(2, 10, 8), (2, 11, 8)], "Slice"),
    "split_size_from_shape": (lambda: Pieces(lambda h: h.split(h.shape[1] // 2 + 1, dim=1)), [(2, 6, 8), (3, 9, 8)], "Slice"),
}
# unbind needs the number of pieces: the trace pins the dim to its size, the graph records that
# size, and each new size exports again (x.unbind(1)[-1] is then right at every size).
UNBIND = (lambda: Pieces(lambda h: pick(1, 0, -1)(h.unbind(1))), [(2, 5, 8), (2, 6, 8)], "Gather")


def outputs(out):
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("name", [*sorted(CASES), "unbind_pinned"])
def test_split_chunk_trains_like_eager(name):
    factory, shapes, lowered_to = CASES.get(name, UNBIND)
    eager, copied = twin(factory)
    model = ORTModule(copied)
    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_ours = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for step, shape in enumerate(shapes * 2):
        x = torch.randn(shape, generator=gen)
        x_eager, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
        want, got = outputs(eager(x_eager)), outputs(model(x_ours))
        assert len(got) == len(want)
        for k, (g, w) in enumerate(zip(got, want)):
            torch.testing.assert_close(g, w, **TOL, msg=lambda m: f"step {step} output {k}: {m}")
        want[0].backward()
        got[0].backward()
        torch.testing.assert_close(x_ours.grad, x_eager.grad, **TOL, msg=lambda m: f"step {step} dx: {m}")
        for (pname, p), q in zip(eager.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, **TOL, msg=lambda m: f"step {step} d{pname}: {m}")
        opt_eager.step(), opt_ours.step()
        opt_eager.zero_grad(), opt_ours.zero_grad()
    for (pname, p), q in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(q, p, **TOL, msg=lambda m: f"{pname} after {len(shapes) * 2} steps: {m}")

    stats = model.stats()
    exports = len(shapes) * 2 if name == "unbind_pinned" else 1  # else one graph for both sizes
    assert (stats["exports"], stats["fallback"]) == (exports, None), stats
    # The start/end arithmetic is host values: a step reads nothing back from the device.
    assert (stats["host_reads_forward"], stats["host_reads_backward"]) == (0, 0), stats
    ops = {n.op_type for n in onnx.load_from_string(model._last_engine.forward_graph_onnx()).graph.node}
    assert lowered_to in ops and not ops & SEQUENCE_OPS, ops


def test_sequence_read_by_another_op_is_a_clear_error():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(
        [helper.make_node("SplitToSequence", ["x"], ["seq"], name="/split", axis=1),
         helper.make_node("ConcatFromSequence", ["seq"], ["y"], name="/cat", axis=1)],
        "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    with pytest.raises(_C.UnsupportedOpError, match=r"'SplitToSequence' \(node /split\).*read by "
                                                    r"ConcatFromSequence \(node /cat\)"):
        _C.Engine(model.SerializeToString(), True, [True])
