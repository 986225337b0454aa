"""Op cases of the fused normalisation/dropout ops (skip_layer_norm_fusion, bias_dropout_fusion):
each fused kernel against its unfused reference — the ATen ops eager runs (x + bias + skip, then
native_layer_norm and its backward; F.dropout of x + bias, then + residual). Forward here and in
test_engine_ops.py; backward of every forward row through the gradient rule in
test_op_gradients.py. fp32 rows with a last dim of 64/384 run the AVX-512 loop's full lanes,
37 its masked tail; f64/f16 rows run the reference path. Tolerances: op_table.TOL (fp32 rtol 1e-5,
atol 1e-6): the fused loop sums rows in 16 lanes where ATen uses its own order."""
import torch
import torch.nn.functional as F

from op_table import OURS, Case, f

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


def bias_dropout(p, has_bias=True, has_res=True):
    """BiasDropout's reference -> (Y, Mask): F.dropout(x + bias) + residual, as eager draws it."""
    def ref(x, *rest):
        rest = list(rest)
        bias = rest.pop(0) if has_bias else None
        res = rest.pop(0) if has_res else None
        d = F.dropout(x + bias if bias is not None else x, p, training=True)
        return (d + res if res is not None else d), d != 0
    return ref


_C64 = [f(2, 5, 64), f(2, 5, 64), f(64), f(64), f(64)]

CASES = [
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
         check_grad=False, id="SkipLayerNorm-f16"),  # f16 autograd on CPU: covered by the f32/f64 rows
    # --- SkipLayerNormGrad(dY, [dSum], Sum, Gamma, Mean, InvStdDev) -> (dX, dGamma, dBeta, dBias)
    Case("SkipLayerNormGrad", grad_inputs((2, 5, 64)), skip_ln_grad, domain=OURS, n_out=4),
    Case("SkipLayerNormGrad", grad_inputs((7, 37)), skip_ln_grad, domain=OURS, n_out=4, id="SkipLayerNormGrad-tail"),
    Case("SkipLayerNormGrad", grad_inputs((3, 6), torch.float64), skip_ln_grad, domain=OURS, n_out=4,
         id="SkipLayerNormGrad-f64"),
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
]
