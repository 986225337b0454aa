"""Op cases of the fused elementwise ops (bias_gelu_fusion, elementwise_chain_fusion): each fused
kernel against its unfused eager reference, forward here and backward through test_op_gradients
(BiasGelu, FusedElementwise) plus rows for the gradient kernels themselves.

FusedElementwise's program (see csrc/core/passes/elementwise_chain_fusion.cc): `ops`, `operands`
(two per op: i < n_inputs is input i, n_inputs + k is result k, -(k + 1) is consts[k]) and `consts`.
`run_program` below is the unfused reference: one eager op per instruction."""
import torch
import torch.nn.functional as F

from op_table import OURS, Case, f, pos

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

CASES = [
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
]
