// Gradient rules of softmax-family ops and the losses the exporter emits for
// F.cross_entropy (SoftmaxCrossEntropyLoss) and F.nll_loss (NegativeLogLikelihoodLoss).
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"

namespace torch_ort {
namespace {

Attributes axis_attr(const GradCtx& g) {
  Attributes a;
  a.set("axis", g.attrs().get_int("axis", -1));  // opset >= 13 default
  return a;
}

void softmax_grad(GradCtx& g) {  // dX = Y · (dY − Σ dY·Y)
  g.set_grad(0, g.ours("SoftmaxGrad", {g.grad_out(0), g.out(0)}, axis_attr(g), DType::kUndefined,
                       g.info(g.in(0)).shape));
}

void log_softmax_grad(GradCtx& g) {  // dX = dY − exp(Y) · Σ dY
  g.set_grad(0, g.ours("LogSoftmaxGrad", {g.grad_out(0), g.out(0)}, axis_attr(g), DType::kUndefined,
                       g.info(g.in(0)).shape));
}

Attributes loss_attrs(const GradCtx& g) {
  Attributes a;
  a.set("reduction", g.attrs().get_string("reduction", "mean"));
  a.set("ignore_index", g.attrs().get_int("ignore_index", -100));
  return a;
}

// d scores = (softmax(scores) − onehot(labels)) · w · dLoss / normaliser, computed from the
// forward's log_prob output without ever materialising a one-hot.
void softmax_cross_entropy_grad(GradCtx& g) {
  if (g.has_grad_out(1))
    throw GradientError(g.node().describe() + ": a gradient through the log_prob output is not supported");
  std::vector<ValueId> ins{g.grad_out(0), g.out(1), g.in(1)};
  if (g.has_in(2)) ins.push_back(g.in(2));
  g.set_grad(0, g.ours("SoftmaxCrossEntropyLossGrad", std::move(ins), loss_attrs(g),
                       DType::kUndefined, g.info(g.in(0)).shape));
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
