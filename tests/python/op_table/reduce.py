"""The reduce family (csrc/core/ops/reduce.cc): reductions, softmax, CumSum and their gradients."""
import torch
import torch.nn.functional as F
from onnx import TensorProto, numpy_helper

from op_table import Case, OURS, f, i64, labels, lp, nll_grad, pos, sce_grad  # noqa: F401


def cumsum(axis, exclusive=False, reverse=False):
    """ONNX CumSum written with torch ops: flip for reverse, shift one place for exclusive."""
    def ref(x, _axis):
        y = (x.flip(axis) if reverse else x).cumsum(axis, dtype=x.dtype)
        if exclusive:
            y = torch.cat([torch.zeros_like(y.narrow(axis, 0, 1)), y.narrow(axis, 0, y.size(axis) - 1)], axis)
        return y.flip(axis) if reverse else y
    return ref


CASES = [
    Case("Softmax", [f(2, 3, 4)], lambda x: torch.softmax(x, -1)),
    Case("Softmax", [f(2, 3, 4)], lambda x: torch.softmax(x, 1), attrs=dict(axis=1), id="Softmax-axis1"),
    Case("Softmax", [f(2, 3, 4)], lambda x: torch.softmax(x.reshape(2, 12), 1).reshape(2, 3, 4),
         opset=11, id="Softmax-opset11-coerced"),
    Case("LogSoftmax", [f(3, 5)], lambda x: torch.log_softmax(x, -1)),
    Case("LogSoftmax", [f(2, 3, 4)], lambda x: torch.log_softmax(x, 0), attrs=dict(axis=-3), id="LogSoftmax-neg-axis"),
    Case("ReduceSum", [f(2, 3, 4), i64(1)], lambda x, a: x.sum(1, keepdim=True)),
    Case("ReduceSum", [f(2, 3, 4), i64(0, -1)], lambda x, a: x.sum((0, 2)), attrs=dict(keepdims=0),
         consts=(1,), id="ReduceSum-const-axes"),
    Case("ReduceSum", [f(2, 3), None], lambda x: x.sum().reshape(1, 1), id="ReduceSum-all"),
    Case("ReduceSum", [f(2, 3), None], lambda x: x, attrs=dict(noop_with_empty_axes=1), id="ReduceSum-noop"),
    Case("ReduceSum", [torch.tensor([[1, 2], [3, 4]], dtype=torch.int32), i64(1)],
         lambda x, a: x.sum(1, keepdim=True, dtype=torch.int32), id="ReduceSum-int32"),
    Case("ReduceMean", [f(2, 3, 4), i64(-1)], lambda x, a: x.mean(-1), attrs=dict(keepdims=0)),
    Case("CumSum", [f(2, 3, 4), i64(1)], cumsum(1)),
    Case("CumSum", [f(2, 3, 4), i64(-1)], cumsum(-1, exclusive=True), attrs=dict(exclusive=1), id="CumSum-exclusive"),
    Case("CumSum", [f(2, 3, 4), i64(0)], cumsum(0, reverse=True), attrs=dict(reverse=1), id="CumSum-reverse"),
    Case("CumSum", [f(5, 3), i64(0)], cumsum(0, exclusive=True, reverse=True), attrs=dict(exclusive=1, reverse=1),
         consts=(1,), id="CumSum-exclusive-reverse-const-axis"),
    Case("CumSum", [torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32), i64(1)], cumsum(1), id="CumSum-int32"),
    Case("ReduceMean", [f(2, 3, 4)], lambda x: x.mean((0, 2), keepdim=True), attrs=dict(axes=[0, 2]),
         opset=13, id="ReduceMean-opset13-attr"),
    Case("SoftmaxGrad", [f(2, 3, 4), torch.softmax(f(2, 3, 4), 1)],
         lambda dy, y: y * (dy - (dy * y).sum(1, keepdim=True)), attrs=dict(axis=1), domain=OURS),
    Case("LogSoftmaxGrad", [f(3, 5), torch.log_softmax(f(3, 5), -1)],
         lambda dy, y: dy - y.exp() * dy.sum(-1, keepdim=True), domain=OURS),
    Case("SumToShape", [f(2, 3, 4), i64(3, 1)], lambda dy, s: dy.sum(0).sum(1, keepdim=True), domain=OURS),
    Case("ReduceSumGrad", [f(2, 4), i64(2, 3, 4)], lambda dy, s: dy.unsqueeze(1).expand(2, 3, 4),
         attrs=dict(axes=[1], keepdims=0), domain=OURS),
    Case("ReduceSumGrad", [f(1, 1), i64(2, 3)], lambda dy, s: dy.expand(2, 3), domain=OURS, id="ReduceSumGrad-all"),
    Case("ReduceMeanGrad", [f(2, 1, 1), i64(2, 3, 4)], lambda dy, s: dy.expand(2, 3, 4) / 12,
         attrs=dict(axes=[1, -1]), domain=OURS),
]

t = torch.tensor
_r = f(2, 3, 4)
_ties = t([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, 2.0]])
CASES += [
    Case("ReduceMax", [_r, i64(1)], lambda x, a: x.amax(1, keepdim=True)),
    Case("ReduceMax", [_r, None], lambda x: x.amax().reshape(1, 1, 1), id="ReduceMax-all"),
    Case("ReduceMin", [_r, i64(0, -1)], lambda x, a: x.amin((0, 2)), attrs=dict(keepdims=0)),
    Case("ReduceMin", [_r], lambda x: x.amin(2, keepdim=True), attrs=dict(axes=[2]), opset=13,
         id="ReduceMin-opset13-attr"),
    Case("ReduceProd", [pos(2, 3, 4), i64(0, 2)], lambda x, a: x.prod(2, keepdim=True).prod(0, keepdim=True)),
    Case("ReduceProd", [i64(1, 2, 3, 4).reshape(2, 2), i64(1)], lambda x, a: x.prod(1), attrs=dict(keepdims=0),
         id="ReduceProd-int64"),
    Case("ReduceL1", [_r, i64(-1)], lambda x, a: x.abs().sum(-1, keepdim=True)),
    Case("ReduceL2", [_r, i64(1)], lambda x, a: x.square().sum(1).sqrt(), attrs=dict(keepdims=0)),
    # a row of zeros: norm 0, whose gradient torch takes as 0
    Case("ReduceL2", [torch.cat([_r[:, :1] * 0, _r[:, 1:]], 1), i64(0, -1)],
         lambda x, a: torch.linalg.vector_norm(x, dim=(0, 2), keepdim=True), id="ReduceL2-zero-norm-keepdims"),
    Case("ReduceL2", [_r, None], lambda x: x, attrs=dict(noop_with_empty_axes=1), id="ReduceL2-noop"),
    Case("ReduceLogSum", [pos(2, 3), i64(1)], lambda x, a: x.sum(1, keepdim=True).log()),
    Case("ReduceLogSumExp", [_r * 10, i64(-1)], lambda x, a: torch.logsumexp(x, -1, keepdim=True)),
    Case("ReduceSumSquare", [_r, i64(0)], lambda x, a: x.square().sum(0, keepdim=True)),
    Case("ReduceSumSquare", [_r, None], lambda x: x, attrs=dict(noop_with_empty_axes=1), id="ReduceSumSquare-noop"),
    Case("ArgMax", [_ties], lambda x: x.argmax(1, keepdim=True), attrs=dict(axis=1)),
    Case("ArgMax", [_ties], lambda x: 3 - x.flip(1).argmax(1), attrs=dict(axis=1, keepdims=0, select_last_index=1),
         id="ArgMax-last-index"),
    Case("ArgMin", [_ties], lambda x: x.argmin(0), attrs=dict(axis=0, keepdims=0)),
    Case("TopK", [f(3, 6), i64(2)], lambda x, k: tuple(torch.topk(x, 2, -1)), n_out=2, consts=(1,)),
    Case("TopK", [f(4, 3), i64(3)], lambda x, k: tuple(torch.topk(x, 3, 0, largest=False)),
         attrs=dict(axis=0, largest=0), n_out=2, consts=(1,), id="TopK-smallest-axis0"),
]
