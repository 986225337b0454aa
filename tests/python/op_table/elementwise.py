"""The elementwise family (csrc/core/ops/elementwise.cc): arithmetic, activations, comparisons, casts."""
import torch
import torch.nn.functional as F
from onnx import TensorProto, numpy_helper

from op_table import Case, OURS, f, i64, labels, lp, nll_grad, pos, sce_grad  # noqa: F401


t = torch.tensor
_tie = f(3, 4)
_tie_b = torch.where(f(3, 4) > 0, _tie, _tie - 1)  # equal to _tie at about half the places
_row = f(4)


def minmax_grad(fn):
    """Reference for MinMaxGrad: autograd of torch.maximum/minimum (ties split between the two)."""
    def ref(dy, y, a, b):
        a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
        return torch.autograd.grad(fn(a, b), (a, b), dy)
    return ref


aten = torch.ops.aten


CASES = [
    Case("Add", [f(2, 3), f(3)], torch.add, id="Add-bcast"),
    Case("Add", [i64(1, 2, 3), i64(5)], torch.add, id="Add-int64"),
    Case("Sub", [f(2, 1, 4), f(3, 1)], torch.sub),
    Case("Mul", [f(2, 3, dtype=torch.float64), f(2, 3, dtype=torch.float64)], torch.mul, id="Mul-f64"),
    Case("Div", [f(4, 3), pos(3)], torch.div),
    Case("Div", [i64(7, -7, 9), i64(2, 2, -4)], lambda a, b: torch.div(a, b, rounding_mode="trunc"), id="Div-int-trunc"),
    Case("Neg", [f(3, 4)], torch.neg),
    Case("Pow", [pos(2, 3), f(3)], torch.pow),
    Case("Pow", [pos(2, 3), i64(2)], lambda x, y: torch.pow(x, y).float(), id="Pow-int-exponent"),
    # One exponent held on the host goes as a number (RMSNorm's x²), as eager's x.pow(2) does.
    Case("Pow", [f(3, 4), t(2.0)], lambda x, y: torch.pow(x, 2.0), consts=(1,), id="Pow-square-constant"),
    Case("Pow", [pos(5), t([[0.5]])], torch.pow, id="Pow-exponent-of-higher-rank"),
    Case("Sqrt", [pos(5)], torch.sqrt),
    Case("Exp", [f(2, 2)], torch.exp),
    Case("Log", [pos(6)], torch.log),
    Case("Abs", [f(3, 3)], torch.abs),
    Case("Relu", [f(4, 5)], torch.relu),
    Case("Tanh", [f(4, 5)], torch.tanh),
    Case("Sigmoid", [f(4, 5)], torch.sigmoid),
    Case("Sigmoid", [f(4, 5, dtype=torch.float16)], torch.sigmoid, id="Sigmoid-f16"),
    Case("Identity", [f(3)], lambda x: x),
    Case("Cast", [f(3, 4) * 4], lambda x: x.to(torch.int64), attrs=dict(to=TensorProto.INT64)),
    Case("Cast", [i64(0, 3, -2)], lambda x: x.to(torch.bool), attrs=dict(to=TensorProto.BOOL), id="Cast-bool"),
    Case("Sum", [f(2, 3), f(3), f(1, 1)], lambda a, b, c: a + b + c),
    Case("Equal", [i64(1, 2, 3), i64(2)], torch.eq),
    Case("Greater", [f(2, 3), f(3)], torch.gt),
    Case("Less", [f(2, 3), f(2, 1)], torch.lt),
    Case("Where", [f(2, 3) > 0, f(2, 3), f(3)], torch.where),
    Case("Not", [f(5) > 0], torch.logical_not),
    # --- our domain: gradient ops emitted by the autodiff
    Case("ReluGrad", [f(3, 4), torch.relu(f(3, 4))], lambda dy, y: dy * (y > 0), domain=OURS),
    Case("SigmoidGrad", [f(3, 4), torch.sigmoid(f(3, 4))], lambda dy, y: dy * y * (1 - y), domain=OURS),
    Case("TanhGrad", [f(3, 4), torch.tanh(f(3, 4))], lambda dy, y: dy * (1 - y * y), domain=OURS),
    Case("Reciprocal", [pos(2, 5)], torch.reciprocal),
    Case("Reciprocal", [-pos(7)], torch.reciprocal, id="Reciprocal-negative"),
    Case("Trilu", [f(3, 4)], torch.triu),
    Case("Trilu", [f(2, 3, 4), t(-1)], lambda x, k: torch.tril(x, -1), attrs=dict(upper=0), id="Trilu-lower-k"),
    Case("Trilu", [f(4, 4), t(1)], lambda x, k: torch.triu(x, 1), consts=(1,), id="Trilu-upper-k-const"),
    Case("Trilu", [torch.ones(4, 4, dtype=torch.bool)], lambda x: torch.tril(x), attrs=dict(upper=0),
         id="Trilu-bool-causal-mask"),
    # --- CastLike, Max/Min (ties split dY equally between two equal operands, as torch does)
    Case("CastLike", [f(3, 4), t(0.0, dtype=torch.float64)], lambda x, like: x.double()),
    Case("CastLike", [f(3, 4), t(0.0, dtype=torch.float16)], lambda x, like: x.half(), id="CastLike-f16"),
    Case("CastLike", [f(5) * 4, i64(0)], lambda x, like: x.long(), id="CastLike-to-int64"),
    Case("Max", [f(3, 4), f(4)], torch.maximum),
    Case("Max", [_tie, _tie_b], torch.maximum, id="Max-ties"),
    Case("Max", [f(3, 4), f(3, 1), f(4)], lambda a, b, c: torch.maximum(torch.maximum(a, b), c), id="Max-three"),
    Case("Max", [f(3)], lambda x: x, id="Max-one"),
    Case("Max", [i64(1, 5, 3), i64(4)], torch.maximum, id="Max-int64"),
    Case("Min", [f(2, 3), f(3)], torch.minimum),
    Case("Min", [_tie_b, _tie], torch.minimum, id="Min-ties"),
    # --- comparisons and logic (no gradient)
    Case("GreaterOrEqual", [i64(1, 2, 3), i64(2)], torch.ge),
    Case("GreaterOrEqual", [f(2, 3), f(3)], torch.ge, id="GreaterOrEqual-float"),
    Case("LessOrEqual", [i64(1, 2, 3), i64(2)], torch.le),
    Case("And", [f(2, 3) > 0, f(3) > 0], torch.logical_and),
    Case("Or", [f(2, 3) > 0, f(3) > 0], torch.logical_or),
    Case("Xor", [f(2, 3) > 0, f(2, 1) > 0], torch.logical_xor),
    Case("IsNaN", [t([1.0, float("nan"), float("inf"), -float("inf")])], torch.isnan),
    Case("IsInf", [t([1.0, float("nan"), float("inf"), -float("inf")])], torch.isinf),
    Case("IsInf", [t([1.0, float("inf"), -float("inf")])], torch.isposinf, attrs=dict(detect_negative=0),
         id="IsInf-positive-only"),
    Case("IsInf", [t([1.0, float("inf"), -float("inf")])], torch.isneginf, attrs=dict(detect_positive=0),
         id="IsInf-negative-only"),
    Case("MinMaxGrad", [f(3, 4), torch.maximum(_tie, _tie_b), _tie, _tie_b], minmax_grad(torch.maximum),
         n_out=2, domain=OURS),
    Case("MinMaxGrad", [f(3, 4), torch.minimum(_tie, _row), _tie, _row], minmax_grad(torch.minimum),
         n_out=2, domain=OURS, id="MinMaxGrad-broadcast"),
    # --- Gelu (opset 20) and Erf
    Case("Gelu", [f(3, 7)], F.gelu),
    Case("Gelu", [f(3, 7)], lambda x: F.gelu(x, approximate="tanh"), attrs=dict(approximate="tanh"), id="Gelu-tanh"),
    Case("Gelu", [f(4, dtype=torch.float64)], F.gelu, id="Gelu-f64"),
    Case("Erf", [f(3, 4)], torch.erf),
    Case("GeluGrad", [f(3, 5), f(3, 5)], lambda dy, x: aten.gelu_backward(dy, x), domain=OURS),
    Case("GeluGrad", [f(3, 5), f(3, 5)], lambda dy, x: aten.gelu_backward(dy, x, approximate="tanh"),
         attrs=dict(approximate="tanh"), domain=OURS, id="GeluGrad-tanh"),
    Case("ErfGrad", [f(3, 4), f(3, 4)], lambda dy, x: dy * 2 / torch.pi ** 0.5 * torch.exp(-x * x), domain=OURS),
]

_half = t([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.3, -0.7])  # Round's ties go to even
_u = torch.rand(3, 4, generator=torch.Generator().manual_seed(3)) * 1.8 - 0.9  # inside (-1, 1)
CASES += [
    # --- unary math: trigonometric, hyperbolic, rounding, sign
    Case("Sin", [f(3, 4)], torch.sin),
    Case("Cos", [f(3, 4)], torch.cos),
    Case("Tan", [_u], torch.tan),
    Case("Asin", [_u], torch.asin),
    Case("Acos", [_u], torch.acos),
    Case("Atan", [f(3, 4)], torch.atan),
    Case("Sinh", [f(3, 4)], torch.sinh),
    Case("Cosh", [f(3, 4)], torch.cosh),
    Case("Asinh", [f(3, 4)], torch.asinh),
    Case("Acosh", [pos(3, 4) + 1], torch.acosh),
    Case("Atanh", [_u], torch.atanh),
    Case("EyeLike", [f(3, 4)], lambda x: torch.eye(3, 4)),
    Case("EyeLike", [f(3, 4)], lambda x: torch.ones(3, 4, dtype=torch.int64).triu(1).tril(1),
         attrs=dict(k=1, dtype=TensorProto.INT64), id="EyeLike-k1-int64"),
    Case("EyeLike", [f(2, 3)], lambda x: torch.zeros(2, 3), attrs=dict(k=-2), id="EyeLike-off-the-matrix"),
    Case("Floor", [f(3, 4) * 3], torch.floor),
    Case("Ceil", [f(3, 4) * 3], torch.ceil),
    Case("Round", [_half], torch.round),
    Case("Sign", [t([-2.0, 0.0, 3.5])], torch.sign),
    Case("Sign", [i64(-4, 0, 7)], torch.sign, id="Sign-int64"),
    # --- activations with attributes
    Case("Softplus", [f(4, 5) * 4], F.softplus),
    Case("Softsign", [f(4, 5)], F.softsign),
    Case("Elu", [f(4, 5)], lambda x: F.elu(x, 0.7), attrs=dict(alpha=0.7)),
    Case("Celu", [f(4, 5)], lambda x: F.celu(x, 1.5), attrs=dict(alpha=1.5)),
    Case("Selu", [f(4, 5)], F.selu),
    Case("Selu", [f(4, 5)], lambda x: 1.5 * torch.where(x > 0, x, 2.0 * (x.exp() - 1)),
         attrs=dict(alpha=2.0, gamma=1.5), id="Selu-attrs"),
    Case("LeakyRelu", [f(4, 5)], lambda x: F.leaky_relu(x, 0.2), attrs=dict(alpha=0.2)),
    Case("LeakyRelu", [f(4, 5)], F.leaky_relu, id="LeakyRelu-default"),
    Case("HardSigmoid", [f(4, 5) * 4], lambda x: (0.3 * x + 0.4).clamp(0, 1), attrs=dict(alpha=0.3, beta=0.4)),
    Case("HardSwish", [f(4, 5) * 4], F.hardswish),
    Case("Mish", [f(4, 5)], F.mish),
    Case("ThresholdedRelu", [f(4, 5) * 2], lambda x: torch.where(x > 0.5, x, 0.0), attrs=dict(alpha=0.5)),
    Case("PRelu", [f(2, 3, 4), f(3, 1)], lambda x, s: torch.where(x < 0, x * s, x)),
    Case("Clip", [f(3, 4), t(-0.5), t(0.7)], lambda x, lo, hi: x.clamp(lo, hi)),
    Case("Clip", [f(3, 4), None, t(0.2)], lambda x, hi: x.clamp(max=hi), id="Clip-max-only"),
    Case("Clip", [i64(-5, 0, 9), i64(-2), i64(4)], lambda x, lo, hi: x.clamp(lo, hi), id="Clip-int64"),
    Case("Clip", [f(3, 4)], lambda x: x.clamp(-0.1, 0.3), attrs=dict(min=-0.1, max=0.3), opset=6,
         id="Clip-opset6-attrs"),
    # --- Mod and the bitwise ops (no gradient)
    Case("Mod", [i64(7, -7, 7, -7), i64(3, 3, -3, -3)], torch.remainder),
    Case("Mod", [t([7.5, -7.5, 7.5]), t([2.0, 2.0, -2.0])], torch.fmod, attrs=dict(fmod=1), check_grad=False,
         id="Mod-fmod-float"),
    Case("BitwiseAnd", [i64(12, 10, -1), i64(10)], torch.bitwise_and),
    Case("BitwiseOr", [i64(12, 10, 0), i64(3)], torch.bitwise_or),
    Case("BitwiseXor", [i64(12, 10, 0), i64(6, 6, 6)], torch.bitwise_xor),
    Case("BitwiseNot", [i64(0, 5, -3)], torch.bitwise_not),
    Case("BitShift", [t([1, 8, 255], dtype=torch.uint8), t([2, 1, 4], dtype=torch.uint8)],
         torch.bitwise_left_shift, attrs=dict(direction="LEFT")),
    Case("BitShift", [t([1, 8, 255], dtype=torch.uint8), t([1], dtype=torch.uint8)],
         torch.bitwise_right_shift, attrs=dict(direction="RIGHT"), id="BitShift-right"),
]
