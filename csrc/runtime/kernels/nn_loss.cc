// Classification losses and their gradients: SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss
// (ONNX), CrossEntropyLoss (ours: with label smoothing) and their Grad ops (our domain).
// Scores are (N, C) or (N, C, d1, ..., dk); labels are
// (N) or (N, d1, ..., dk). Gradients go through ATen's NLL backward, which scatters into a dense
// (N, C, ...) gradient directly: no one-hot of the labels is ever built.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <cstdint>
#include <limits>

#include <ATen/core/Reduction.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_log_softmax.h>
#include <ATen/ops/_log_softmax_backward_data.h>
#include <ATen/ops/add.h>
#include <ATen/ops/div.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/masked_fill.h>
#include <ATen/ops/masked_select.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/nll_loss2d_backward.h>
#include <ATen/ops/nll_loss2d_forward.h>
#include <ATen/ops/nll_loss_backward.h>
#include <ATen/ops/nll_loss_forward.h>
#include <ATen/ops/nll_loss_nd.h>
#include <ATen/ops/sum.h>

#include "csrc/runtime/kernels/common.h"
#include "csrc/runtime/kernels/decimal.h"

namespace torch_ort::kernels {
namespace {

// ONNX has no default ignore_index (nothing is ignored); ATen needs some value, so pick one no
// valid label can equal.
constexpr int64_t kIgnoreNothing = std::numeric_limits<int64_t>::min();

struct NllArgs {
  int64_t reduction;                  // at::Reduction::{None, Mean, Sum}
  int64_t ignore_index;
  std::optional<at::Tensor> weight;   // (C) class weights
  at::Tensor labels;                  // int64
};

NllArgs nll_args(const KernelCtx& c, int labels_at, int weight_at) {
  NllArgs a;
  const std::string r = c.attrs.get_string("reduction", "mean");
  if (r == "mean") a.reduction = at::Reduction::Mean;
  else if (r == "sum") a.reduction = at::Reduction::Sum;
  else if (r == "none") a.reduction = at::Reduction::None;
  else c.fail("reduction must be 'mean', 'sum' or 'none', got '" + r + "'");
  a.ignore_index = c.attrs.has("ignore_index") ? c.attrs.get_int("ignore_index", 0) : kIgnoreNothing;
  if (c.has_input(weight_at)) a.weight = c.input(weight_at);
  a.labels = c.input(labels_at);
  if (a.labels.scalar_type() != at::kLong) a.labels = a.labels.to(at::kLong);
  return a;
}

// d(loss)/d(input) of nll_loss_nd(input, labels): ATen has backward kernels for 1-D/2-D inputs
// and for 4-D (N, C, H, W); other ranks are viewed as (N, C, 1, D) exactly as nll_loss_nd does.
at::Tensor nll_backward(const KernelCtx& c, at::Tensor grad, const at::Tensor& input,
                        const NllArgs& a) {
  if (a.reduction != at::Reduction::None && grad.dim() != 0) {
    if (grad.numel() != 1) c.fail("a reduced loss needs a scalar gradient, got " + c10::str(grad.sizes()));
    grad = grad.reshape({});
  }
  if (input.dim() <= 2) {
    auto tw = std::get<1>(at::nll_loss_forward(input, a.labels, a.weight, a.reduction, a.ignore_index));
    return at::nll_loss_backward(grad, input, a.labels, a.weight, a.reduction, a.ignore_index, tw);
  }
  const bool is4d = input.dim() == 4;
  const int64_t n = input.size(0), cls = input.size(1);
  at::Tensor in4 = is4d ? input : input.reshape({n, cls, 1, input.numel() == 0 ? 0 : -1});
  at::Tensor lab3 = is4d ? a.labels : a.labels.reshape({n, 1, a.labels.numel() == 0 ? 0 : -1});
  if (a.reduction == at::Reduction::None && !is4d) grad = grad.reshape(lab3.sizes());
  auto tw = std::get<1>(at::nll_loss2d_forward(in4, lab3, a.weight, a.reduction, a.ignore_index));
  at::Tensor g = at::nll_loss2d_backward(grad, in4, lab3, a.weight, a.reduction, a.ignore_index, tw);
  return is4d ? g : g.reshape(input.sizes());
}

void check_scores(const KernelCtx& c, const at::Tensor& s, const at::Tensor& labels) {
  if (s.dim() < 2) c.fail("scores must be (N, C, ...), got shape " + c10::str(s.sizes()));
  if (labels.dim() != s.dim() - 1)
    c.fail("labels of shape " + c10::str(labels.sizes()) + " do not match scores of shape " +
           c10::str(s.sizes()) + " (expected rank " + std::to_string(s.dim() - 1) + ")");
}

// (scores, labels, [weights]) -> (loss, [log_prob])
void softmax_cross_entropy_kernel(KernelCtx& c) {
  const at::Tensor& scores = c.input(0);
  NllArgs a = nll_args(c, 1, 2);
  check_scores(c, scores, a.labels);
  at::Tensor log_prob = at::_log_softmax(scores, 1, false);
  c.set_output(0, at::nll_loss_nd(log_prob, a.labels, a.weight, a.reduction, a.ignore_index));
  c.set_output(1, std::move(log_prob));
}

// (input = log-probabilities, target, [weight]) -> loss
void nll_loss_kernel(KernelCtx& c) {
  const at::Tensor& input = c.input(0);
  NllArgs a = nll_args(c, 1, 2);
  check_scores(c, input, a.labels);
  c.set_output(0, at::nll_loss_nd(input, a.labels, a.weight, a.reduction, a.ignore_index));
}

// dScores = dLogProb − softmax · Σ_c dLogProb, written over dLogProb (a fresh [N, C, ...] buffer
// the kernel made): the backward reads each row's sum before it writes the row, element by
// element, so the values are those of the out-of-place call, and a GPT's loss gradient holds one
// B·T·vocab buffer instead of two.
at::Tensor log_softmax_backward_over(at::Tensor g_lp, const at::Tensor& lp) {
  if (!g_lp.is_contiguous() || !g_lp.sizes().equals(lp.sizes()) ||
      g_lp.scalar_type() != lp.scalar_type() || g_lp.storage().use_count() != 1)
    return at::_log_softmax_backward_data(g_lp, lp, 1, lp.scalar_type());
  return at::_log_softmax_backward_data_out(g_lp, g_lp, lp, 1, lp.scalar_type());
}

// (dLoss, log_prob, labels, [weights]) -> dScores = dLogProb - softmax * sum_c(dLogProb)
void softmax_cross_entropy_grad_kernel(KernelCtx& c) {
  const at::Tensor& log_prob = c.input(1);
  NllArgs a = nll_args(c, 2, 3);
  check_scores(c, log_prob, a.labels);
  c.set_output(0, log_softmax_backward_over(nll_backward(c, c.input(0), log_prob, a), log_prob));
}

// (dLoss, input, labels, [weights]) -> dInput
void nll_loss_grad_kernel(KernelCtx& c) {
  const at::Tensor& input = c.input(1);
  NllArgs a = nll_args(c, 2, 3);
  check_scores(c, input, a.labels);
  c.set_output(0, nll_backward(c, c.input(0), input, a));
}


// --- CrossEntropyLoss (ours) = F.cross_entropy(..., label_smoothing=ε), which ONNX's op lacks:
// loss = (1 − ε)·NLL + (ε / C)·S with S_i = −Σ_c w_c·log_prob[i, c] (0 where ignored), S reduced
// like NLL (mean: over the target weights). Written step by step as PyTorch's
// cross_entropy_loss_label_smoothing so that the values match eager bit for bit.

double label_smoothing(const KernelCtx& c) {
  const double eps = shortest_decimal(c.attrs.get_float("label_smoothing", 0.0f));
  if (!(eps >= 0.0 && eps <= 1.0)) c.fail("label_smoothing must be in [0, 1], got " + std::to_string(eps));
  return eps;
}

at::Tensor class_weight_view(const at::Tensor& w, const at::Tensor& scores) {  // (C) -> (1, C, 1, ...)
  std::vector<int64_t> shape(scores.dim(), 1);
  shape[1] = w.size(0);
  return w.view(shape);
}

// The "mean" denominator: the summed weights (or the count) of the targets not ignored.
at::Tensor mean_denominator(const NllArgs& a, const at::Tensor& ignored) {
  if (a.weight) return a.weight->gather(0, a.labels.masked_select(at::logical_not(ignored)).flatten()).sum();
  return at::logical_not(ignored).sum();
}

// (scores, labels, [weights]) -> (loss, [log_prob])
void cross_entropy_kernel(KernelCtx& c) {
  const at::Tensor& scores = c.input(0);
  NllArgs a = nll_args(c, 1, 2);
  check_scores(c, scores, a.labels);
  const double eps = label_smoothing(c);
  at::Tensor lp = at::_log_softmax(scores, 1, false);
  at::Tensor nll = at::nll_loss_nd(lp, a.labels, a.weight, a.reduction, a.ignore_index);
  at::Tensor smooth = a.weight ? at::neg(at::sum(at::mul(lp, class_weight_view(*a.weight, lp)), 1))
                               : at::neg(at::sum(lp, 1));
  const at::Tensor ignored = at::eq(a.labels, a.ignore_index);
  smooth.masked_fill_(ignored, 0.0);
  at::Tensor ret = a.reduction == at::Reduction::None ? smooth
                   : a.reduction == at::Reduction::Sum ? smooth.sum()
                   : at::div(smooth.sum(), mean_denominator(a, ignored));
  c.set_output(0, at::add(at::mul(nll, 1.0 - eps), at::mul(ret, eps / static_cast<double>(lp.size(1)))));
  c.set_output(1, std::move(lp));
}

// (dLoss, log_prob, labels, [weights]) -> dScores, fused: the gradient reaching log_prob is
// (1 − ε)·(−w_t at the target) − (ε / C)·w_c·g_i (0 where ignored), then one log-softmax backward
// (dScores = softmax − smoothed, weighted target). No one-hot is built.
void cross_entropy_grad_kernel(KernelCtx& c) {
  const at::Tensor& dloss = c.input(0);
  const at::Tensor& lp = c.input(1);
  NllArgs a = nll_args(c, 2, 3);
  check_scores(c, lp, a.labels);
  const double eps = label_smoothing(c);
  at::Tensor g_lp = nll_backward(c, at::mul(dloss, 1.0 - eps), lp, a);
  if (eps != 0.0) {
    const at::Tensor ignored = at::eq(a.labels, a.ignore_index);
    at::Tensor g = at::mul(dloss, eps / static_cast<double>(lp.size(1)));  // d ret
    if (a.reduction == at::Reduction::Mean) g = at::div(g, mean_denominator(a, ignored));
    if (a.reduction != at::Reduction::None) g = g.reshape({}).expand(a.labels.sizes());
    // masked_fill, not a multiply: a mean over no targets divides by 0, and eager's gradient is
    // still 0 (not NaN) at ignored positions.
    at::Tensor g_smooth = at::neg(at::masked_fill(g.reshape(a.labels.sizes()), ignored, 0.0)).unsqueeze(1);
    if (a.weight) g_smooth = at::mul(g_smooth, class_weight_view(*a.weight, lp));
    g_lp = at::add(g_lp, g_smooth);
  }
  c.set_output(0, log_softmax_backward_over(std::move(g_lp), lp));
}

}  // namespace

REGISTER_KERNEL("SoftmaxCrossEntropyLoss", softmax_cross_entropy_kernel);
REGISTER_KERNEL("NegativeLogLikelihoodLoss", nll_loss_kernel);
REGISTER_KERNEL_IN(kOurDomain, "SoftmaxCrossEntropyLossGrad", softmax_cross_entropy_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "NegativeLogLikelihoodLossGrad", nll_loss_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "CrossEntropyLoss", cross_entropy_kernel);
REGISTER_KERNEL_IN(kOurDomain, "CrossEntropyLossGrad", cross_entropy_grad_kernel);

}  // namespace torch_ort::kernels
