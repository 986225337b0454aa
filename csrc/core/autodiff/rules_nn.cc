// Gradient rules of softmax-family ops and the losses the exporter emits for
// F.cross_entropy (SoftmaxCrossEntropyLoss) and F.nll_loss (NegativeLogLikelihoodLoss).
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"

namespace torch_ort {
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
// forward's log_prob output without ever materialising a one-hot.
// A gradient reaching the log_prob output (when the model uses it) adds LogSoftmax's gradient
// along the class axis (1).
void softmax_cross_entropy_grad(GradCtx& g) {
  ValueId d = kNoValue;
  if (g.has_grad_out(0)) {
    std::vector<ValueId> ins{g.grad_out(0), g.out(1), g.in(1)};
    if (g.has_in(2)) ins.push_back(g.in(2));
    d = g.ours("SoftmaxCrossEntropyLossGrad", std::move(ins), loss_attrs(g), DType::kUndefined,
               g.info(g.in(0)).shape);
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

}  // namespace

REGISTER_GRADIENT("Dropout", dropout_grad, {1, 2});
REGISTER_GRADIENT("Softmax", softmax_grad, {});
REGISTER_GRADIENT("LogSoftmax", log_softmax_grad, {});
REGISTER_GRADIENT("SoftmaxCrossEntropyLoss", softmax_cross_entropy_grad, {1, 2});
REGISTER_GRADIENT("NegativeLogLikelihoodLoss", nll_loss_grad, {1, 2});

}  // namespace torch_ort
