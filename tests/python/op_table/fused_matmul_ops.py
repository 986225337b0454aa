"""Op cases of our FusedMatMul (Y = alpha·A'·B' + bias, A' = A with its two innermost dims swapped
when transA, B' likewise): the Linear layer on a 3-D activation, flags, alpha, batched and
broadcast products. The reference is the unfused subgraph (transpose, matmul, scale, add) in
eager PyTorch; test_op_gradients.py checks every row's backward against its autograd."""
import torch

from op_table import OURS, Case, f


def mt(x):
    return x.transpose(-1, -2)


def ref(ta=0, tb=0, alpha=1.0):
    def run(a, b, bias=None):
        y = alpha * ((mt(a) if ta else a) @ (mt(b) if tb else b))
        return y if bias is None else y + bias
    return run


def fmm(inputs, ta=0, tb=0, alpha=1.0, id=""):
    attrs = dict(transA=ta, transB=tb)
    if alpha != 1.0:
        attrs["alpha"] = alpha
    return Case("FusedMatMul", inputs, ref(ta, tb, alpha), attrs=attrs, domain=OURS, id=f"FusedMatMul-{id}")


CASES = [
    fmm([f(2, 3, 4), f(5, 4), f(5)], tb=1, id="linear-3d"),              # x·Wᵀ + b, one addmm over rows
    fmm([f(3, 4), f(4, 5), f(5)], id="2d-bias"),
    fmm([f(4, 3), f(5, 4), f(5)], ta=1, tb=1, alpha=0.5, id="2d-trans-alpha"),
    fmm([f(2, 3, 4), f(5, 4), f(1, 1, 5)], tb=1, id="row-bias-3d"),
    fmm([f(2, 3, 4), f(4, 5), None], alpha=2.0, id="3d-nobias-alpha"),
    fmm([f(2, 4, 3), f(4, 5), f(5)], ta=1, id="3d-transA"),             # no row view: batched path
    fmm([f(2, 2, 3, 4), f(2, 2, 5, 4)], tb=1, alpha=0.25, id="4d-qkT"),  # attention scores
    fmm([f(3, 4), f(2, 4, 5), f(5)], id="2d-by-3d-bcast"),
    fmm([f(2, 1, 3, 4), f(3, 4, 5)], id="batch-bcast"),
    fmm([f(2, 3, 4), f(4, 5), f(3, 5)], id="matrix-bias-3d"),           # a (M, N) bias: still correct
    fmm([f(3, 4), f(4, 5), torch.tensor(0.7)], id="scalar-bias"),
]
