"""The fused family (csrc/core/ops/fused.cc): our fused ops (BiasGelu, FusedElementwise, FusedMatMul, SkipLayerNorm) and their gradients."""
import torch
import torch.nn.functional as F

from op_table import Case, OURS, f, pos  # noqa: F401


aten = torch.ops.aten
_EAGER = {
    "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div, "Neg": torch.neg,
    "Exp": torch.exp, "Log": torch.log, "Tanh": torch.tanh, "Sigmoid": torch.sigmoid, "Relu": torch.relu,
    "Sqrt": torch.sqrt, "Erf": torch.erf, "Reciprocal": torch.reciprocal,
}


def run_program(attrs, *inputs):
    ops, operands, consts = attrs["ops"], attrs["operands"], attrs.get("consts", [])
    n, vals = len(inputs), []

    def get(o):
        if o < 0:  # `consts` is an ONNX floats attribute: float32 values, whatever the inputs' dtype
            return torch.tensor(consts[-o - 1], dtype=torch.float32).to(inputs[0].dtype)
        return inputs[o] if o < n else vals[o - n]

    for k, op in enumerate(ops):
        a, b = operands[2 * k], operands[2 * k + 1]
        if op == "Pow":
            vals.append(torch.pow(get(a), float(torch.tensor(consts[-b - 1], dtype=torch.float32))))
        elif op in ("Add", "Sub", "Mul", "Div"):
            vals.append(_EAGER[op](get(a), get(b)))
        else:
            vals.append(_EAGER[op](get(a)))
    return vals[-1]


def program_grads(attrs):
    """FusedElementwiseGrad's reference: autograd of run_program, one gradient per input."""
    def ref(dy, *inputs):
        xs = [t.detach().clone().requires_grad_() for t in inputs]
        return torch.autograd.grad(run_program(attrs, *xs), xs, dy, allow_unused=True, materialize_grads=True)
    return ref


def fe(attrs, inputs, id, grad=True):
    rows = [Case("FusedElementwise", inputs, lambda *xs: run_program(attrs, *xs), attrs=attrs, domain=OURS,
                 id=f"FusedElementwise-{id}")]
    if grad:
        out = run_program(attrs, *inputs)
        rows.append(Case("FusedElementwiseGrad", [f(*out.shape, dtype=out.dtype)] + inputs, program_grads(attrs),
                         attrs=attrs, domain=OURS, n_out=len(inputs), id=f"FusedElementwiseGrad-{id}"))
    return rows


# a·sigmoid(a)·b over two halves (a fused gate/up projection's SwiGLU): Sigmoid(a), Mul(a, ·), Mul(·, b).
SWIGLU = dict(ops=["Sigmoid", "Mul", "Mul"], operands=[0, 0, 0, 2, 3, 1])


def joined(attrs, inputs, id):
    """FusedElementwiseGrad with `join` = [0, 1]: both inputs' gradients side by side along the last
    dim in output 0 (split_grad_join), as SplitGrad would have concatenated them."""
    out = run_program(attrs, *inputs)
    return Case("FusedElementwiseGrad", [f(*out.shape, dtype=out.dtype)] + inputs,
                lambda *a: torch.cat(program_grads(attrs)(*a), -1), attrs=dict(attrs, join=[0, 1]), domain=OURS,
                id=f"FusedElementwiseGrad-join-{id}")


# 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), as HF GPT-2's gelu_new exports (one input x).
GELU_NEW = dict(ops=["Mul", "Pow", "Mul", "Add", "Mul", "Tanh", "Add", "Mul"],
                operands=[0, -1, 0, -2, 2, -3, 0, 3, 4, -4, 5, 0, 6, -5, 1, 7],
                consts=[0.5, 3.0, 0.044715, 0.7978845608028654, 1.0])


# (x + b)·sigmoid(x + b) − exp(−(x + b)²) / 2: a row-broadcast bias, x + b read three times.
SILU_BIAS = dict(ops=["Add", "Sigmoid", "Mul", "Mul", "Neg", "Exp", "Mul", "Sub"],
                 operands=[0, 1, 2, 0, 2, 3, 2, 2, 5, 0, 6, 0, 7, -1, 4, 8], consts=[0.5])


# sqrt(relu(x)·y + 1) / (erf(x) − 2) + log(y) + 1 / y: two full inputs and every other unary op.
MIXED = dict(ops=["Relu", "Mul", "Add", "Sqrt", "Erf", "Sub", "Div", "Log", "Add", "Reciprocal", "Add"],
             operands=[0, 0, 2, 1, 3, -1, 4, 0, 0, 0, 6, -2, 5, 7, 1, 0, 8, 9, 1, 0, 10, 11],
             consts=[1.0, 2.0])


# x · s with s a one-element tensor input (a scalar operand that is not a constant).
SCALE = dict(ops=["Mul", "Tanh"], operands=[0, 1, 2, 0])


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


aten = torch.ops.aten


def skip_ln(bias_first=True, eps=1e-5, has_beta=True, has_bias=True):
    """SkipLayerNorm's reference -> (Y, Mean, InvStdDev, Sum): the unfused ops in exported order."""
    def ref(x, skip, gamma, *rest):
        rest = list(rest)
        beta = rest.pop(0) if has_beta else None
        bias = rest.pop(0) if has_bias else None
        s = (x + bias if bias is not None else x) + skip
        y, m, r = aten.native_layer_norm(s, [s.shape[-1]], gamma, beta, eps)
        stash = torch.float64 if s.dtype == torch.float64 else torch.float32
        return y, m.to(stash), r.to(stash), s
    return ref


def skip_ln_grad(dy, dsum, s, gamma, mean, invstd):
    """SkipLayerNormGrad's reference -> (dX, dGamma, dBeta, dBias): ATen's layer-norm backward + dSum."""
    dx, dg, db = aten.native_layer_norm_backward(dy, s, [s.shape[-1]], mean, invstd, gamma, gamma, [True] * 3)
    dx = dx + dsum
    return dx, dg, db, dx.reshape(-1, s.shape[-1]).sum(0)


def grad_inputs(shape, dtype=torch.float32):
    s, g = f(*shape, dtype=dtype), f(shape[-1], dtype=dtype)
    _, m, r = aten.native_layer_norm(s, [shape[-1]], g, None, 1e-5)
    return [f(*shape, dtype=dtype), f(*shape, dtype=dtype), s, g, m, r]


_C64 = [f(2, 5, 64), f(2, 5, 64), f(64), f(64), f(64)]


CASES = [
    # --- ProductRows(A, B, [bias], Full, rows) = the rows of Full (A·B computed already) A holds
    Case("ProductRows", [f(2, 4), f(6, 4), None, f(1, 3, 6), torch.tensor([2, 0])],
         lambda a, b, full, rows: full.reshape(-1, 6)[rows], attrs=dict(transB=1), domain=OURS),
    # --- BiasGelu(X, [bias]) = gelu(X + bias): the AVX-512 loop (fp32) or the ATen reference (fp64, or
    # no AVX-512) against unfused eager gelu(x + b). Inputs stay within |x| < ~5, where ATen's fp32
    # GELU is itself within the table's tolerance of the exact value; the loop's accuracy over
    # [-10, 10] is test_fusion_gelu.py's test_bias_gelu_loop_accuracy.
    Case("BiasGelu", [f(4, 6), f(6)], lambda x, b: F.gelu(x + b), domain=OURS),
    Case("BiasGelu", [f(2, 3, 37), f(37)], lambda x, b: F.gelu(x + b, approximate="tanh"),
         attrs=dict(approximate="tanh"), domain=OURS, id="BiasGelu-tanh-3d-tail"),
    Case("BiasGelu", [f(3, 2500)], lambda x: F.gelu(x), domain=OURS, id="BiasGelu-no-bias-wide"),
    Case("BiasGelu", [f(5, 7, dtype=torch.float64), f(7, dtype=torch.float64)],
         lambda x, b: F.gelu(x + b, approximate="tanh"), attrs=dict(approximate="tanh"), domain=OURS,
         id="BiasGelu-f64-reference"),
    Case("BiasGeluGrad", [f(4, 6), f(4, 6), f(6)], lambda dy, x, b: aten.gelu_backward(dy, x + b), domain=OURS),
    Case("BiasGeluGrad", [f(2, 3, 37), f(2, 3, 37), f(37)],
         lambda dy, x, b: aten.gelu_backward(dy, x + b, approximate="tanh"), attrs=dict(approximate="tanh"),
         domain=OURS, id="BiasGeluGrad-tanh-3d-tail"),
    Case("BiasGeluGrad", [f(3, 2500), f(3, 2500)], lambda dy, x: aten.gelu_backward(dy, x), domain=OURS,
         id="BiasGeluGrad-no-bias-wide"),
    # --- FusedElementwise / FusedElementwiseGrad: tiles of 2048 elements, rows wrapping across tiles
    *fe(GELU_NEW, [f(3, 2500)], "gelu-new"),
    *fe(SILU_BIAS, [f(3, 2500), f(2500)], "row-bias"),
    *fe(MIXED, [f(4, 9), pos(4, 9)], "mixed-unary"),
    *fe(SCALE, [f(2, 5), f(1)], "scalar-input"),
    *fe(GELU_NEW, [f(4, 5, dtype=torch.float64)], "f64-reference"),
    joined(SWIGLU, [f(6, 100), f(6, 100)], "short-rows"),             # tiles of one row each
    joined(SWIGLU, [f(9, 5), f(9, 5)], "narrow-rows"),                # computed apart, then concatenated
    joined(SWIGLU, [f(2, 3, 2500), f(2, 3, 2500)], "long-rows-3d"),  # two tiles per row
    joined(SWIGLU, [f(3, 7, dtype=torch.float64), f(3, 7, dtype=torch.float64)], "f64-reference"),
    fmm([f(2, 3, 4), f(5, 4), f(5)], tb=1, id="linear-3d"),              # x·Wᵀ + b, one addmm over rows,
    fmm([f(3, 4), f(4, 5), f(5)], id="2d-bias"),
    fmm([f(4, 3), f(5, 4), f(5)], ta=1, tb=1, alpha=0.5, id="2d-trans-alpha"),
    fmm([f(2, 3, 4), f(5, 4), f(1, 1, 5)], tb=1, id="row-bias-3d"),
    fmm([f(2, 3, 4), f(4, 5), None], alpha=2.0, id="3d-nobias-alpha"),
    fmm([f(2, 4, 3), f(4, 5), f(5)], ta=1, id="3d-transA"),             # no row view: batched path,
    fmm([f(2, 2, 3, 4), f(2, 2, 5, 4)], tb=1, alpha=0.25, id="4d-qkT"),  # attention scores,
    fmm([f(3, 4), f(2, 4, 5), f(5)], id="2d-by-3d-bcast"),
    fmm([f(2, 1, 3, 4), f(3, 4, 5)], id="batch-bcast"),
    fmm([f(2, 3, 4), f(4, 5), f(3, 5)], id="matrix-bias-3d"),           # a (M, N) bias: still correct,
    fmm([f(3, 4), f(4, 5), torch.tensor(0.7)], id="scalar-bias"),
    # --- SkipLayerNorm(X, Skip, Gamma, [Beta], [Bias]) -> (Y, Mean, InvStdDev, Sum)
    Case("SkipLayerNorm", _C64, skip_ln(), domain=OURS, n_out=4, id="SkipLayerNorm-bias"),
    Case("SkipLayerNorm", [f(6, 37), f(6, 37), f(37), f(37)], skip_ln(has_bias=False), domain=OURS, n_out=4,
         id="SkipLayerNorm-tail"),
    Case("SkipLayerNorm", [f(4, 3, 384), f(4, 3, 384), f(384), None, f(384)], skip_ln(has_beta=False, eps=1e-12),
         attrs=dict(epsilon=1e-12), domain=OURS, n_out=4, id="SkipLayerNorm-no-beta-eps"),
    Case("SkipLayerNorm", [f(3, 8, dtype=torch.float64), f(3, 8, dtype=torch.float64), f(8, dtype=torch.float64),
                           f(8, dtype=torch.float64)], skip_ln(has_bias=False), domain=OURS, n_out=4,
         id="SkipLayerNorm-f64"),
    Case("SkipLayerNorm", [f(3, 8, dtype=torch.float16), f(3, 8, dtype=torch.float16), f(8, dtype=torch.float16),
                           f(8, dtype=torch.float16), f(8, dtype=torch.float16)], skip_ln(), domain=OURS, n_out=4,
         check_grad=False, id="SkipLayerNorm-f16"),  # f16 autograd on CPU: covered by the f32/f64 rows,
    # --- SkipLayerNormGrad(dY, [dSum], Sum, Gamma, Mean, InvStdDev) -> (dX, dGamma, dBeta, dBias)
    Case("SkipLayerNormGrad", grad_inputs((2, 5, 64)), skip_ln_grad, domain=OURS, n_out=4),
    Case("SkipLayerNormGrad", grad_inputs((7, 37)), skip_ln_grad, domain=OURS, n_out=4, id="SkipLayerNormGrad-tail"),
    Case("SkipLayerNormGrad", grad_inputs((3, 6), torch.float64), skip_ln_grad, domain=OURS, n_out=4,
         id="SkipLayerNormGrad-f64"),
]
