"""The random family (csrc/core/ops/random.cc): Dropout, BiasDropout and DropoutGrad (seeded rows)."""
import torch
import torch.nn.functional as F
from onnx import TensorProto, numpy_helper

from op_table import Case, OURS, f, i64, labels, lp, nll_grad, pos, sce_grad  # noqa: F401


def bias_dropout(p, has_bias=True, has_res=True):
    """BiasDropout's reference -> (Y, Mask): F.dropout(x + bias) + residual, as eager draws it."""
    def ref(x, *rest):
        rest = list(rest)
        bias = rest.pop(0) if has_bias else None
        res = rest.pop(0) if has_res else None
        d = F.dropout(x + bias if bias is not None else x, p, training=True)
        return (d + res if res is not None else d), d != 0
    return ref


CASES = [
    Case("Dropout", [f(3, 4)], lambda x: (x, torch.ones(3, 4, dtype=torch.bool)), n_out=2, id="Dropout-inference"),
    Case("Dropout", [f(50, 40), torch.tensor(0.3), torch.tensor(True)],
         lambda x, r, t: (lambda y: (y, y != 0))(F.dropout(x, 0.3, training=True)), n_out=2, seed=7,
         id="Dropout-training-seeded"),
    Case("DropoutGrad", [f(3, 4), f(3, 4) > 0, torch.tensor(0.25), torch.tensor(True)],
         lambda dy, m, r, t: dy * m / 0.75, domain=OURS),
    Case("DropoutGrad", [f(3, 4), f(3, 4) > 0], lambda dy, m: dy, domain=OURS, id="DropoutGrad-inference"),
    # --- BiasDropout(X, [Bias], [Residual], [ratio], [training_mode]) -> (Y, Mask), seeded as eager
    Case("BiasDropout", [f(40, 24), f(24), f(40, 24), torch.tensor(0.3), torch.tensor(True)], bias_dropout(0.3),
         domain=OURS, n_out=2, seed=5, id="BiasDropout-bias-residual"),
    Case("BiasDropout", [f(3, 7, 33), f(33), None, torch.tensor(0.1), torch.tensor(True)],
         bias_dropout(0.1, has_res=False), domain=OURS, n_out=2, seed=6, id="BiasDropout-bias-tail"),
    Case("BiasDropout", [f(30, 20), None, f(30, 20), torch.tensor(0.5), torch.tensor(True)],
         bias_dropout(0.5, has_bias=False), domain=OURS, n_out=2, seed=8, id="BiasDropout-residual"),
    Case("BiasDropout", [f(30, 20, dtype=torch.float64), f(20, dtype=torch.float64), f(30, 20, dtype=torch.float64),
                         torch.tensor(0.2, dtype=torch.float64), torch.tensor(True)], bias_dropout(0.2), domain=OURS, n_out=2, seed=9,
         id="BiasDropout-f64"),
    Case("BiasDropout", [f(5, 6), f(6), f(5, 6)], lambda x, b, r: (x + b + r, torch.ones(5, 6, dtype=torch.bool)),
         domain=OURS, n_out=2, id="BiasDropout-inference"),
    # --- Dropout edge cases (seeded rows in core_ops.py; bit-exactness in test_nn_ops.py)
    Case("Dropout", [f(4, 5), torch.tensor(1.0), torch.tensor(True)],
         lambda x, r, t: (x * 0, torch.zeros(4, 5, dtype=torch.bool)), n_out=2, id="Dropout-p1"),
    Case("Dropout", [f(30, 20, dtype=torch.float16), torch.tensor(0.2, dtype=torch.float64), torch.tensor(True)],
         lambda x, r, t: (lambda y: (y, y != 0))(F.dropout(x, 0.2, training=True)), n_out=2, seed=3,
         id="Dropout-f16-double-ratio"),
    Case("DropoutGrad", [f(3, 4), f(3, 4) > 0, torch.tensor(1.0), torch.tensor(True)],
         lambda dy, m, r, t: torch.zeros(3, 4), domain=OURS, id="DropoutGrad-p1"),
]
