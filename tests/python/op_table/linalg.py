"""The linalg family (csrc/core/ops/linalg.cc): MatMul, Gemm, Einsum, Det and our GroupedMatMul."""
import torch
import torch.nn.functional as F
from onnx import TensorProto, numpy_helper

from op_table import Case, OURS, f, i64, labels, lp, nll_grad, pos, sce_grad  # noqa: F401


CASES = [
    Case("MatMul", [f(3, 4), f(4, 2)], torch.matmul),
    Case("MatMul", [f(2, 1, 3, 4), f(5, 4, 2)], torch.matmul, id="MatMul-batched-bcast"),
    Case("MatMul", [f(4), f(2, 4, 3)], torch.matmul, id="MatMul-1d"),
    Case("Gemm", [f(3, 4), f(4, 5), f(5)], lambda a, b, c: a @ b + c),
    Case("Gemm", [f(4, 3), f(5, 4), f(3, 5)], lambda a, b, c: 0.5 * a.T @ b.T + 2.0 * c,
         attrs=dict(transA=1, transB=1, alpha=0.5, beta=2.0), id="Gemm-trans-alpha-beta"),
    Case("Gemm", [f(3, 4), f(4, 5), None], lambda a, b: 3.0 * (a @ b), attrs=dict(alpha=3.0), id="Gemm-noC"),
    Case("Gemm", [f(3, 4), f(4, 5), f(3, 1)], lambda a, b, c: a @ b + c, id="Gemm-C-col"),
]
CASES += [
    Case("Einsum", [f(2, 3, 4), f(2, 4, 5)], lambda a, b: torch.einsum("bij,bjk->bik", a, b),
         attrs=dict(equation="bij,bjk->bik"), check_grad=False),
    Case("Einsum", [f(3, 3)], lambda a: torch.einsum("ii", a), attrs=dict(equation="ii"), check_grad=False,
         id="Einsum-trace-implicit"),
    Case("Einsum", [f(2, 3, 4), f(4)], lambda a, b: torch.einsum("...j,j->...", a, b),
         attrs=dict(equation="...j,j->..."), check_grad=False, id="Einsum-ellipsis"),
    Case("Det", [f(2, 3, 3, dtype=torch.float64)], torch.linalg.det, check_grad=False),
]


def grouped(x, w, offs):
    """GroupedMatMul's reference: rows [offs[e-1], offs[e]) of x times w[e], the rest zero."""
    y, start = x.new_zeros(x.shape[0], w.shape[2]), 0
    for e, end in enumerate(offs.tolist()):
        y[start:end] = x[start:end] @ w[e]
        start = end
    return y


def grouped_grad(dy, x, w, offs):
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    return torch.autograd.grad(grouped(xr, wr, offs), (xr, wr), dy)


CASES += [
    # an expert without rows (its dW zero) and a row past the last offset (zero, no gradient)
    Case("GroupedMatMul", [f(7, 4), f(3, 4, 5), torch.tensor([2, 2, 6], dtype=torch.int32)], grouped, domain=OURS),
    Case("GroupedMatMul", [f(5, 3), f(2, 3, 4), torch.tensor([0, 5])], grouped, domain=OURS,
         id="GroupedMatMul-one-expert-int64"),
    Case("GroupedMatMulGrad", [f(7, 5), f(7, 4), f(3, 4, 5), torch.tensor([2, 2, 6], dtype=torch.int32)],
         grouped_grad, domain=OURS, n_out=2),
]
