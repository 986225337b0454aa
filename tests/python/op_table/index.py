"""The index family (csrc/core/ops/index.cc): gathers, scatters and their gradients."""
import torch
import torch.nn.functional as F
from onnx import TensorProto, numpy_helper

from op_table import Case, OURS, f, i64, labels, lp, nll_grad, pos, sce_grad  # noqa: F401


t = torch.tensor


CASES = [
    Case("Gather", [f(5, 3), torch.tensor([[0, -1], [2, 4]])], lambda d, i: d[i % 5]),
    Case("Gather", [f(2, 5), i64(3, 0)], lambda d, i: d[:, [3, 0]], attrs=dict(axis=1), id="Gather-axis1"),
    Case("Gather", [f(4, 3), torch.tensor(2)], lambda d, i: d[2], id="Gather-scalar-index"),
    # --- Gather family: repeated and negative indices (backward must sum them)
    Case("Gather", [f(5, 3), i64(1, -1, 1, 0, 1)], lambda d, i: d[i % 5], id="Gather-repeated-neg"),
    Case("Gather", [f(10, 4), t([[1, 2, 1], [9, -1, 0]])], lambda d, i: torch.nn.functional.embedding(i % 10, d),
         id="Gather-embedding"),
    Case("Gather", [f(2, 3, 4), t([[0, 3], [3, -4]])], lambda d, i: d[:, :, i % 4], attrs=dict(axis=2),
         id="Gather-axis2-2d-idx"),
    Case("Gather", [f(6, 4, dtype=torch.float16), i64(1, 5, 1)], lambda d, i: d[i], id="Gather-f16"),
    Case("GatherElements", [f(3, 4), t([[0, 3], [3, -1], [1, 1]])], lambda d, i: torch.gather(d, 1, i % 4),
         attrs=dict(axis=1)),
    Case("GatherElements", [f(2, 3), t([[2, -1], [0, 0]], dtype=torch.int32)],
         lambda d, i: torch.gather(d, 1, i.long() % 3), attrs=dict(axis=1), id="GatherElements-int32-indices"),
    Case("GatherElements", [f(3, 4), t([[2, 0, -3], [2, 2, 1]])], lambda d, i: torch.gather(d, 0, i % 3),
         id="GatherElements-axis0-smaller"),
    Case("GatherND", [f(3, 4, 2), t([[0, 1], [2, -1], [0, 1]])], lambda d, i: d[i[:, 0] % 3, i[:, 1] % 4]),
    Case("GatherND", [f(3, 4), t([[[2], [0]], [[2], [-3]]])], lambda d, i: d[i[..., 0] % 3], id="GatherND-rows"),
    Case("GatherND", [f(2, 3, 4), t([[[0], [2]], [[1], [1]]])], lambda d, i: d[torch.arange(2)[:, None], i[..., 0]],
         attrs=dict(batch_dims=1), id="GatherND-batch-dims1"),
    Case("GatherND", [i64(4, 5, 6, 7).reshape(2, 2), t([[1, 0], [0, -1]])], lambda d, i: d[i[:, 0], i[:, 1] % 2],
         id="GatherND-int64"),
    # --- LabelRows(labels; ignore_index): the positions of the labels that count (label_sparsity)
    Case("LabelRows", [t([3, -100, 5, -100, 0, 7])], lambda y: torch.nonzero(y != -100).view(-1),
         attrs=dict(ignore_index=-100), domain=OURS),
    Case("LabelRows", [t([-1, -1, -1])], lambda y: torch.nonzero(y != -1).view(-1),
         attrs=dict(ignore_index=-1), domain=OURS, id="LabelRows-none-counts"),
    # --- padding elimination (padding_elimination): the rows that count, gathered, put back, checked
    Case("PaddingRows", [t([[1, 1, 0], [1, 0, 0]]), t([[5, 6, 7], [8, 9, 10]]), t([3, -100, -100, 4, -100, 2])],
         lambda m, ids, y: torch.nonzero((m.reshape(-1) != 0) | (y != -100)).view(-1),
         attrs=dict(ignore_index=-100), domain=OURS),
    Case("PackRows", [f(2, 3, 4), t([0, 2, 3, 5])], lambda x, r: x.flatten(0, 1)[r], domain=OURS),
    Case("PadRows", [f(4, 5), t([0, 2, 3, 5]), i64(2, 3)],
         lambda x, r, s: torch.zeros(6, 5).index_copy(0, r, x).view(2, 3, 5), domain=OURS),
    Case("PaddingMaskCheck", [f(2, 1, 3, 3), t([0, 1, 2, 3, 4, 5]), t([[5, 6, 7], [8, 9, 10]])],
         lambda m, r, ids: m, domain=OURS),
    # --- our domain: gradient ops emitted by the rules above
    Case("GatherGrad", [f(4, 3), i64(5, 3), i64(1, -1, 1, 0)],
         lambda dy, s, i: torch.zeros(5, 3).index_add(0, i % 5, dy), domain=OURS),
    Case("GatherGrad", [f(2, 2, 2, 4), i64(2, 3, 4), t([[0, 2], [2, -1]])],
         lambda dy, s, i: torch.zeros(2, 3, 4).index_add(1, (i % 3).reshape(-1), dy.reshape(2, 4, 4)),
         attrs=dict(axis=1), domain=OURS, id="GatherGrad-axis1-2d"),
    Case("GatherGrad", [f(4, 3), i64(5, 3), i64(1, -1, 1, 0), f(5, 3)],  # added into the accumulator
         lambda dy, s, i, acc: acc.index_add(0, i % 5, dy), domain=OURS, id="GatherGrad-accumulator"),
    Case("GatherElementsGrad", [f(3, 2), i64(3, 4), t([[0, 3], [3, -1], [1, 1]])],
         lambda dy, s, i: torch.zeros(3, 4).scatter_add(1, i % 4, dy), attrs=dict(axis=1), domain=OURS),
    Case("GatherNDGrad", [f(3, 2), i64(3, 4, 2), t([[0, 1], [2, -1], [0, 1]])],
         lambda dy, s, i: torch.zeros(3, 4, 2).index_put((i[:, 0], i[:, 1] % 4), dy, accumulate=True), domain=OURS),
    Case("GatherNDGrad", [f(2, 2, 4), i64(2, 3, 4), t([[[0], [0]], [[1], [2]]])],
         lambda dy, s, i: torch.zeros(2, 3, 4).index_put((torch.arange(2)[:, None], i[..., 0]), dy, accumulate=True),
         attrs=dict(batch_dims=1), domain=OURS, id="GatherNDGrad-batch-dims1"),
]


def _scatter_nd_max(d, i, u):
    """ScatterND with reduction max, index by index (two updates meet at [0, 1])."""
    out = d.clone()
    for (r, c), v in zip(i.tolist(), u):
        out[r, c] = torch.maximum(out[r, c], v)
    return out


_d = f(4, 3)
CASES += [
    Case("ScatterElements", [_d, t([[1, 0, 3], [-1, 2, 0]]), f(2, 3)],
         lambda d, i, u: d.scatter(0, i % 4, u), attrs=dict(axis=0), check_grad=False),
    Case("ScatterElements", [_d, t([[0, 2], [1, 1]]), f(2, 2)],
         lambda d, i, u: d.scatter_add(1, i, u),
         attrs=dict(axis=1, reduction="add"), check_grad=False, id="ScatterElements-add"),
    Case("ScatterND", [_d, t([[2], [0]]), f(2, 3)],
         lambda d, i, u: d.index_put((i[:, 0],), u)),
    Case("ScatterND", [f(2, 3, 4), t([[0, 1], [1, -1]]), f(2, 4)],
         lambda d, i, u: d.index_put((i[:, 0], i[:, 1] % 3), u, accumulate=True),
         attrs=dict(reduction="add"), id="ScatterND-add"),
    Case("ScatterND", [f(2, 3), t([[0, 1], [0, 1], [1, 2]]), t([5.0, -1.0, 2.0])], _scatter_nd_max,
         attrs=dict(reduction="max"), check_grad=False, id="ScatterND-max-repeated"),
    Case("NonZero", [t([[1.0, 0.0, 2.0], [0.0, 0.0, -3.0]])], lambda x: torch.nonzero(x).t()),
    Case("OneHot", [t([0, 2, -1, 5]), t(3), t([0.0, 1.0])],
         lambda i, d, v: torch.stack([F.one_hot(t(0), 3), F.one_hot(t(2), 3), F.one_hot(t(2), 3),
                                      torch.zeros(3, dtype=torch.long)]).float()),
    Case("OneHot", [t([[1, 0]]), t(2), t([-1, 4])],
         lambda i, d, v: torch.where(F.one_hot(i, 2).movedim(-1, 0).bool(), 4, -1), attrs=dict(axis=0),
         id="OneHot-axis0-int"),
]
