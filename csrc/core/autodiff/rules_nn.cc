// Gradient rules of the NN family: softmax ops, the losses the exporter emits for
// F.cross_entropy (SoftmaxCrossEntropyLoss, ours CrossEntropyLoss when label smoothing is on) and
// F.nll_loss, Dropout, LayerNormalization, Gelu, Erf and our Embedding.
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/autodiff/rules_nn.h"
#include "csrc/core/ir/errors.h"

namespace torch_ort {

ValueId layer_norm_stats_grad(GradCtx& g, ValueId x, int64_t axis) {
  const int64_t r = g.rank(x);
  const DType dt = g.info(x).dtype;
  std::vector<int64_t> axes;
  for (int64_t d = axis < 0 ? axis + r : axis; d < r; ++d) axes.push_back(d);
  auto as_x_type = [&](ValueId v) {
    if (g.info(v).dtype == dt) return v;
    Attributes c;
    c.set("to", static_cast<int64_t>(dt));
    return g.op("Cast", {v}, std::move(c), dt, g.info(v).shape);
  };
  auto spread = [&](ValueId v) {
    Attributes a;
    a.set("axes", axes);
    return g.ours("ReduceMeanGrad", {as_x_type(v), g.shape_of(x)}, std::move(a), dt, g.info(x).shape);
  };
  ValueId dx = kNoValue;
  if (g.has_grad_out(1)) dx = spread(g.grad_out(1));
  if (g.has_grad_out(2)) {
    const ValueId r_ = g.out(2);
    const ValueId c = g.neg(g.mul(g.grad_out(2), g.mul(g.mul(r_, r_), r_)));
    const ValueId t = g.mul(spread(c), g.sub(x, as_x_type(g.out(1))));
    dx = dx == kNoValue ? t : g.add(dx, t);
  }
  return dx;
}

namespace {

// Softmax/LogSoftmax: opset >= 13 normalises along `axis` (default -1); older opsets flatten the
// input to 2-D at `axis` (default 1) and normalise each row, so the gradient does the same.
void softmax_family_grad(GradCtx& g, const char* grad_op) {
  const bool coerced = g.opset() < 13;
  const int64_t axis = g.attrs().get_int("axis", coerced ? 1 : -1);
  Attributes a;
  if (!coerced) {
    a.set("axis", axis);
    return g.set_grad(0, g.ours(grad_op, {g.grad_out(0), g.out(0)}, std::move(a), DType::kUndefined,
                                g.info(g.in(0)).shape));
  }
  Attributes flat;
  flat.set("axis", axis);
  a.set("axis", int64_t{1});
  ValueId dy2 = g.op("Flatten", {g.grad_out(0)}, flat);
  ValueId y2 = g.op("Flatten", {g.out(0)}, flat);
  ValueId dx2 = g.ours(grad_op, {dy2, y2}, std::move(a));
  Attributes keep;
  keep.set("allowzero", int64_t{1});
  g.set_grad(0, g.op("Reshape", {dx2, g.shape_of(g.in(0))}, std::move(keep), DType::kUndefined,
                     g.info(g.in(0)).shape));
}
void softmax_grad(GradCtx& g) { softmax_family_grad(g, "SoftmaxGrad"); }         // dX = Y·(dY − Σ dY·Y)
void log_softmax_grad(GradCtx& g) { softmax_family_grad(g, "LogSoftmaxGrad"); }  // dX = dY − exp(Y)·Σ dY

Attributes loss_attrs(const GradCtx& g) {
  Attributes a;
  a.set("reduction", g.attrs().get_string("reduction", "mean"));
  a.set("ignore_index", g.attrs().get_int("ignore_index", -100));
  return a;
}

// d scores = (softmax(scores) − onehot(labels)) · w · dLoss / normaliser, computed from the
// forward's log_prob output without ever materialising a one-hot. Ours CrossEntropyLoss adds
// label smoothing ε: the target becomes (1 − ε)·onehot·w_t + ε/C·w (still fused, no one-hot).
// A gradient reaching the log_prob output (when the model uses it) adds LogSoftmax's gradient
// along the class axis (1).
void softmax_cross_entropy_grad(GradCtx& g) {
  ValueId d = kNoValue;
  if (g.has_grad_out(0)) {
    const bool ours = g.node().domain == kOurDomain;
    Attributes a = loss_attrs(g);
    if (ours) a.set("label_smoothing", g.attrs().get_float("label_smoothing", 0.0f));
    std::vector<ValueId> ins{g.grad_out(0), g.out(1), g.in(1)};
    if (g.has_in(2)) ins.push_back(g.in(2));
    d = g.ours(ours ? "CrossEntropyLossGrad" : "SoftmaxCrossEntropyLossGrad", std::move(ins), std::move(a),
               DType::kUndefined, g.info(g.in(0)).shape);
  }
  if (g.has_grad_out(1)) {
    Attributes a;
    a.set("axis", int64_t{1});
    ValueId dlp = g.ours("LogSoftmaxGrad", {g.grad_out(1), g.out(1)}, std::move(a), DType::kUndefined,
                         g.info(g.in(0)).shape);
    d = d == kNoValue ? dlp : g.add(d, dlp);
  }
  g.set_grad(0, d);
}

// d input = −onehot(labels) · w · dLoss / normaliser (the input itself is read for its shape).
void nll_loss_grad(GradCtx& g) {
  std::vector<ValueId> ins{g.grad_out(0), g.in(0), g.in(1)};
  if (g.has_in(2)) ins.push_back(g.in(2));
  g.set_grad(0, g.ours("NegativeLogLikelihoodLossGrad", std::move(ins), loss_attrs(g),
                       DType::kUndefined, g.info(g.in(0)).shape));
}

// Dropout(X, ratio?, training_mode?): dX = dY · mask / (1 − ratio) with the forward's mask; with
// no training_mode input the op is an identity (inference) and so is its gradient.
void dropout_grad(GradCtx& g) {
  if (!g.has_in(2)) return g.set_grad(0, g.grad_out(0));
  const ValueId ratio = g.has_in(1) ? g.in(1) : kNoValue;
  g.set_grad(0, g.ours("DropoutGrad", {g.grad_out(0), g.out(1), ratio, g.in(2)}, {}, DType::kUndefined,
                       g.info(g.in(0)).shape));
}


// LayerNormalization(X, Scale, [B]) with the forward's Mean (output 1) and InvStdDev (output 2):
// dX and dScale from ATen's layer-norm backward, dB = Σ_outer dY.
void layer_norm_grad(GradCtx& g) {
  const int64_t axis = g.attrs().get_int("axis", -1);
  Attributes a;
  a.set("axis", axis);
  ValueId dx = kNoValue;
  if (g.has_grad_out(0)) {
    const std::vector<ValueId> ins{g.grad_out(0), g.in(0), g.in(1), g.out(1), g.out(2)};
    if (g.needs(0)) dx = g.ours("LayerNormalizationGrad", ins, a, DType::kUndefined, g.info(g.in(0)).shape);
    if (g.needs(1))
      g.set_grad(1, g.ours("LayerNormalizationScaleGrad", ins, a, DType::kUndefined, g.info(g.in(1)).shape));
    if (g.needs(2)) g.set_grad(2, g.sum_to_shape_of(g.grad_out(0), g.in(2)));
  } else {  // only the statistics are read: they do not depend on Scale or B
    for (int i : {1, 2})
      if (g.needs(i)) g.set_grad(i, g.mul(g.in(i), g.const_scalar(0.0, g.info(g.in(i)).dtype)));
  }
  if (g.needs(0) && (g.has_grad_out(1) || g.has_grad_out(2))) {
    const ValueId ds = layer_norm_stats_grad(g, g.in(0), axis);
    dx = dx == kNoValue ? ds : g.add(dx, ds);
  }
  g.set_grad(0, dx);
}

// Gelu: dX = dY · Φ'(X) (exact or tanh form, as the forward's `approximate`); reads X.
void gelu_grad(GradCtx& g) {
  Attributes a;
  a.set("approximate", g.attrs().get_string("approximate", "none"));
  g.set_grad(0, g.ours("GeluGrad", {g.grad_out(0), g.in(0)}, std::move(a), DType::kUndefined,
                       g.info(g.in(0)).shape));
}

void erf_grad(GradCtx& g) {  // dX = dY · 2/√π · exp(−X²)
  g.set_grad(0, g.ours("ErfGrad", {g.grad_out(0), g.in(0)}, {}, DType::kUndefined, g.info(g.in(0)).shape));
}

// Ours Embedding(weight, indices; padding_idx): dWeight is dense, dY rows summed per index, zero
// at padding_idx. Only the weight's shape is kept for backward, not the weight.
void embedding_grad(GradCtx& g) {
  Attributes a;
  a.set("padding_idx", g.attrs().get_int("padding_idx", -1));
  a.set("scale_grad_by_freq", g.attrs().get_int("scale_grad_by_freq", 0));
  g.set_grad(0, g.ours("EmbeddingGrad", {g.grad_out(0), g.in(1), g.shape_of(g.in(0))}, std::move(a),
                       DType::kUndefined, g.info(g.in(0)).shape));
}

}  // namespace

REGISTER_GRADIENT("LayerNormalization", layer_norm_grad, {});
REGISTER_GRADIENT("Gelu", gelu_grad, {});
REGISTER_GRADIENT("Erf", erf_grad, {});
REGISTER_GRADIENT_IN(kOurDomain, "CrossEntropyLoss", softmax_cross_entropy_grad, {1, 2});
REGISTER_GRADIENT_IN(kOurDomain, "Embedding", embedding_grad, {1});
REGISTER_GRADIENT("Dropout", dropout_grad, {1, 2});
REGISTER_GRADIENT("Softmax", softmax_grad, {});
REGISTER_GRADIENT("LogSoftmax", log_softmax_grad, {});
REGISTER_GRADIENT("SoftmaxCrossEntropyLoss", softmax_cross_entropy_grad, {1, 2});
REGISTER_GRADIENT("NegativeLogLikelihoodLoss", nll_loss_grad, {1, 2});

}  // namespace torch_ort
