"""The nn family (csrc/core/ops/nn.cc): layer normalization, losses, embedding and their gradients."""
import torch
import torch.nn.functional as F
from onnx import TensorProto, numpy_helper

from op_table import Case, OURS, f, i64, labels, lp, nll_grad, pos, sce_grad  # noqa: F401


aten = torch.ops.aten


def ln_stats(x, w, b, axis=-1, eps=1e-5):  # (Y, Mean, InvStdDev) with keepdim statistics
    return aten.native_layer_norm(x, list(x.shape[axis:]), w, b, eps)


def ln_backward(which):  # native_layer_norm_backward's dX (0) or dScale (1), normalising the last dim
    return lambda dy, x, w, m, r: aten.native_layer_norm_backward(
        dy, x, list(x.shape[-1:]), m, r, w, None, [which == 0, which == 1, False])[which]


def ce(reduction="mean", ignore_index=-100, ls=0.1):
    """Our CrossEntropyLoss's attributes and F.cross_entropy as its reference."""
    attrs = dict(reduction=reduction, ignore_index=ignore_index, label_smoothing=ls)
    return attrs, lambda x, y, w=None: F.cross_entropy(x, y, weight=w, reduction=reduction,
                                                      ignore_index=ignore_index, label_smoothing=ls)


def ce_grad(reduction="mean", ignore_index=-100, ls=0.1):
    """CrossEntropyLossGrad's reference: autograd of F.cross_entropy at scores = log_prob
    (log_softmax(log_prob) == log_prob, so the op's log_prob input is the forward's)."""
    attrs, loss = ce(reduction, ignore_index, ls)

    def ref(dloss, log_prob, lab, w=None):
        x = log_prob.clone().requires_grad_()
        return torch.autograd.grad(loss(x, lab, w), x, dloss)[0]
    return attrs, ref


_x, _w = f(4, 6), f(6)


_, _mean, _rstd = ln_stats(_x, _w, None)


_pad_ids = torch.tensor([[1, 3, 1], [0, 9, 3]])

# LinearCrossEntropy: 7 rows of hidden 8 over 12 classes in chunks of 2 rows (chunk_bytes 2·12·4),
# two labels ignored; the product-rows form reads rows 4, 0, 6 of a product computed already.
_lx, _lw, _lb = f(7, 8), f(12, 8), f(12)
_ly = torch.tensor([3, -100, 11, 0, -100, 7, 5])
_lfull = (_lx @ _lw.T + _lb).reshape(1, 7, 12)
_lrows = torch.tensor([4, 0, 6])




CASES = [
    # --- LinearCrossEntropy(X, W, [bias], labels, [Full], [rows]) = cross_entropy(X·Wᵀ + bias, labels)
    Case("LinearCrossEntropy", [_lx, _lw, _lb, _ly],
         lambda x, w, b, y: F.cross_entropy(F.linear(x, w, b), y, ignore_index=-100),
         attrs=dict(transB=1, ignore_index=-100, chunk_bytes=2 * 12 * 4), domain=OURS),
    Case("LinearCrossEntropy", [_lx, _lw.T.contiguous(), None, _ly],
         lambda x, w, y: F.cross_entropy(x @ w, y, ignore_index=-100, label_smoothing=0.2, reduction="sum"),
         attrs=dict(ignore_index=-100, label_smoothing=0.2, reduction="sum", chunk_bytes=3 * 12 * 4),
         domain=OURS, id="LinearCrossEntropy-smoothing-sum"),
    Case("LinearCrossEntropy", [_lx[[4, 0, 6]], _lw, _lb, torch.tensor([2, 3, 5]), _lfull, _lrows],
         lambda x, w, b, y, full, rows: F.cross_entropy(F.linear(x, w, b), y),
         attrs=dict(transB=1, chunk_bytes=2 * 12 * 4), domain=OURS, id="LinearCrossEntropy-product-rows"),
    Case("LinearCrossEntropy", [_lx, _lw, None, _ly],
         lambda x, w, y: F.cross_entropy(2.5 * torch.tanh(F.linear(x, w) / 2.5), y, ignore_index=-100),
         attrs=dict(transB=1, ignore_index=-100, softcap=2.5, chunk_bytes=4 * 12 * 4), domain=OURS,
         id="LinearCrossEntropy-softcap"),
    # --- LossGradientScale(unit, dLoss) = unit · dLoss (unit itself when dLoss is 1)
    Case("LossGradientScale", [f(3, 5), torch.tensor(2.5)], lambda u, d: u * d, domain=OURS),
    Case("LossGradientScale", [f(3, 5), torch.tensor(1.0)], lambda u, d: u, domain=OURS,
         id="LossGradientScale-one"),
    Case("SoftmaxCrossEntropyLoss", [f(6, 5), labels(6, classes=5)],
         lambda x, y: (F.cross_entropy(x, y), torch.log_softmax(x, 1)), n_out=2),
    Case("SoftmaxCrossEntropyLoss", [f(3, 4, 2, 2), labels(3, 2, 2, classes=4), pos(4)],
         lambda x, y, w: F.cross_entropy(x, y, weight=w, reduction="sum"), attrs=dict(reduction="sum"),
         id="SCE-4d-weights-sum"),
    Case("SoftmaxCrossEntropyLoss", [f(3, 4, 5), torch.tensor([[0, 1, 2, 3, 1]] * 3)],
         lambda x, y: F.cross_entropy(x, y, reduction="none", ignore_index=1),
         attrs=dict(reduction="none", ignore_index=1), id="SCE-3d-ignore-none"),
    Case("NegativeLogLikelihoodLoss", [lp(6, 5), labels(6, classes=5)], F.nll_loss),
    Case("NegativeLogLikelihoodLoss", [lp(2, 3, 4), torch.tensor([[0, 2, 1, 2], [1, 1, 0, 2]]), pos(3)],
         lambda x, y, w: F.nll_loss(x, y, weight=w, ignore_index=2), attrs=dict(ignore_index=2),
         id="NLL-3d-weights-ignore"),
    Case("SoftmaxCrossEntropyLossGrad", [torch.tensor(1.5), lp(6, 5), labels(6, classes=5)],
         sce_grad("mean"), domain=OURS),
    Case("SoftmaxCrossEntropyLossGrad", [f(3, 5), lp(3, 4, 5), torch.tensor([[0, 1, 2, 3, 1]] * 3), pos(4)],
         sce_grad("none", ignore_index=1), attrs=dict(reduction="none", ignore_index=1), domain=OURS,
         id="SCEGrad-3d-weights-ignore-none"),
    Case("SoftmaxCrossEntropyLossGrad", [torch.tensor(0.7), lp(2, 3, 2, 2), labels(2, 2, 2, classes=3)],
         sce_grad("sum"), attrs=dict(reduction="sum"), domain=OURS, id="SCEGrad-4d-sum"),
    Case("NegativeLogLikelihoodLossGrad", [torch.tensor(2.0), lp(6, 5), labels(6, classes=5), pos(5)],
         nll_grad("mean"), domain=OURS),
    # --- LayerNormalization: (X, Scale, [B]) -> (Y, [Mean], [InvStdDev])
    Case("LayerNormalization", [f(2, 3, 5), f(5), f(5)], lambda x, w, b: F.layer_norm(x, (5,), w, b)),
    Case("LayerNormalization", [f(2, 3, 4), f(3, 4), f(3, 4)], lambda x, w, b: F.layer_norm(x, (3, 4), w, b),
         attrs=dict(axis=1), id="LayerNormalization-axis1"),
    Case("LayerNormalization", [f(4, 6), f(6)], lambda x, w: F.layer_norm(x, (6,), w), id="LayerNormalization-no-bias"),
    Case("LayerNormalization", [f(3, 8), pos(8), f(8)], lambda x, w, b: F.layer_norm(x, (8,), w, b, eps=1e-3),
         attrs=dict(epsilon=1e-3), id="LayerNormalization-eps"),
    Case("LayerNormalization", [f(2, 5, dtype=torch.float64), f(5, dtype=torch.float64), f(5, dtype=torch.float64)],
         lambda x, w, b: F.layer_norm(x, (5,), w, b), id="LayerNormalization-f64"),
    Case("LayerNormalization", [f(2, 3, 6), f(6), f(6)], lambda x, w, b: ln_stats(x, w, b), n_out=3,
         id="LayerNormalization-mean-invstd"),
    Case("LayerNormalization", [f(3, 8, dtype=torch.float16), f(8, dtype=torch.float16), f(8, dtype=torch.float16)],
         lambda x, w, b: (lambda y, m, r: (y, m.float(), r.float()))(*ln_stats(x, w, b)), n_out=3,
         id="LayerNormalization-f16-stash-float"),
    # --- ours: Embedding(weight, indices; padding_idx, scale_grad_by_freq)
    Case("Embedding", [f(10, 4), _pad_ids], lambda w, i: F.embedding(i, w, padding_idx=1),
         attrs=dict(padding_idx=1), domain=OURS),
    Case("Embedding", [f(10, 4), torch.tensor([4, 4, 7, 0], dtype=torch.int32)], lambda w, i: F.embedding(i, w),
         domain=OURS, id="Embedding-int32-repeats"),
    Case("Embedding", [f(10, 3), _pad_ids], lambda w, i: F.embedding(i, w, padding_idx=3, scale_grad_by_freq=True),
         attrs=dict(padding_idx=3, scale_grad_by_freq=1), domain=OURS, id="Embedding-scale-grad-by-freq"),
    # --- ours: CrossEntropyLoss = F.cross_entropy with label smoothing
    Case("CrossEntropyLoss", [f(6, 5), labels(6, classes=5)], ce()[1], attrs=ce()[0], domain=OURS),
    Case("CrossEntropyLoss", [f(6, 5), torch.tensor([0, 2, 4, 2, 1, 3])], ce(ignore_index=2)[1],
         attrs=ce(ignore_index=2)[0], domain=OURS, id="CrossEntropyLoss-ignore"),
    Case("CrossEntropyLoss", [f(3, 4, 5), torch.tensor([[0, 1, 2, 3, 1]] * 3), pos(4)], ce(ignore_index=1, ls=0.2)[1],
         attrs=ce(ignore_index=1, ls=0.2)[0], domain=OURS, id="CrossEntropyLoss-3d-weights-ignore"),
    Case("CrossEntropyLoss", [f(5, 4), torch.tensor([0, -1, 3, 2, -1]), pos(4)], ce("sum", -1)[1],
         attrs=ce("sum", -1)[0], domain=OURS, id="CrossEntropyLoss-sum-weights"),
    Case("CrossEntropyLoss", [f(2, 3, 2, 2), labels(2, 2, 2, classes=3), pos(3)], ce("none")[1],
         attrs=ce("none")[0], domain=OURS, id="CrossEntropyLoss-4d-none-weights"),
    Case("CrossEntropyLoss", [f(6, 5), labels(6, classes=5)], ce(ls=0.0)[1], attrs=ce(ls=0.0)[0], domain=OURS,
         id="CrossEntropyLoss-no-smoothing"),
    Case("CrossEntropyLoss", [f(4, 3, dtype=torch.float64), labels(4, classes=3)], ce(ls=1.0)[1],
         attrs=ce(ls=1.0)[0], domain=OURS, id="CrossEntropyLoss-f64-uniform"),
    # --- gradient ops of our domain
    Case("LayerNormalizationGrad", [f(4, 6), _x, _w, _mean, _rstd], ln_backward(0), domain=OURS),
    Case("LayerNormalizationScaleGrad", [f(4, 6), _x, _w, _mean, _rstd], ln_backward(1), domain=OURS),
    Case("EmbeddingGrad", [f(2, 3, 4), _pad_ids, i64(10, 4)],
         lambda dy, i, s: aten.embedding_dense_backward(dy, i, 10, 1, False), attrs=dict(padding_idx=1), domain=OURS),
    Case("EmbeddingGrad", [f(2, 3, 4), _pad_ids, i64(10, 4), f(10, 4)],  # added into a tied head's gradient
         lambda dy, i, s, acc: acc + aten.embedding_dense_backward(dy, i, 10, 1, False), attrs=dict(padding_idx=1),
         domain=OURS, id="EmbeddingGrad-accumulator"),
    Case("EmbeddingGrad", [f(4, 2), i64(2, 2, 5, 2), i64(6, 2)],
         lambda dy, i, s: aten.embedding_dense_backward(dy, i, 6, -1, True), attrs=dict(scale_grad_by_freq=1),
         domain=OURS, id="EmbeddingGrad-scale-grad-by-freq"),
    Case("CrossEntropyLossGrad", [torch.tensor(1.5), lp(6, 5), labels(6, classes=5)], ce_grad()[1],
         attrs=ce_grad()[0], domain=OURS),
    Case("CrossEntropyLossGrad", [f(3, 5), lp(3, 4, 5), torch.tensor([[0, 1, 2, 3, 1]] * 3), pos(4)],
         ce_grad("none", 1)[1], attrs=ce_grad("none", 1)[0], domain=OURS, id="CrossEntropyLossGrad-3d-none-weights"),
    Case("CrossEntropyLossGrad", [torch.tensor(0.7), lp(5, 4), torch.tensor([0, 2, 3, 2, 1]), pos(4)],
         ce_grad("mean", 2, 0.3)[1], attrs=ce_grad("mean", 2, 0.3)[0], domain=OURS,
         id="CrossEntropyLossGrad-mean-weights-ignore"),
    Case("CrossEntropyLossGrad", [torch.tensor(0.4), lp(2, 3, 2, 2), labels(2, 2, 2, classes=3)],
         ce_grad("sum")[1], attrs=ce_grad("sum")[0], domain=OURS, id="CrossEntropyLossGrad-4d-sum"),
]
