// Shape rules of network layers: softmax family, normalizations, losses, our gradients of these.
#include "csrc/core/ir/graph.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort {
namespace {

void same_as_input0(ShapeCtx& c) { c.set(0, c.in(0)); }
void same_as_input1(ShapeCtx& c) { c.set(0, c.in(1)); }

// Our (dY, Y) gradients of softmax-like ops: the common shape of both.
void softmax_grad_shape(ShapeCtx& c) { c.set(0, broadcast(c, c.in(0), c.in(1))); }

// LayerNormalization(X, Scale, B?) -> (Y, Mean?, InvStdDev?). Y has X's shape; the statistics
// keep X's leading dims up to `axis` (default -1) and have 1 for each normalized dim.
void layer_norm_shape(ShapeCtx& c) {
  const Shape x = c.in(0);
  c.set(0, x);
  if (!x.rank_known) return;
  const int64_t axis = norm_axis(c, c.attrs().get_int("axis", -1), x.rank());
  Shape stats = x;
  for (size_t d = static_cast<size_t>(axis); d < stats.dims.size(); ++d) stats.dims[d] = Dim::known(1);
  c.set(1, stats);
  c.set(2, stats);
}

// BatchNormalization(X, scale, B, mean, var) -> (Y, running_mean?, running_var?) in opset >= 14;
// opsets 9-13 add saved_mean and saved_var. Every statistic has the shape of `mean` (C).
void batch_norm_shape(ShapeCtx& c) {
  c.set(0, c.in(0));
  Shape stat = c.in(3);
  if (!stat.rank_known) {
    const Shape x = c.in(0);
    if (x.rank() >= 2) stat = Shape::of({x.dims[1]});
  }
  for (int k = 1; k < c.num_outputs(); ++k) c.set(k, stat);
}

// SoftmaxCrossEntropyLoss(scores (N, C, d..), labels (N, d..), weights?) -> (loss, log_prob?)
// NegativeLogLikelihoodLoss(input (N, C, d..), target (N, d..), weight?) -> loss
// loss: [] for reduction mean/sum, the labels' shape (N, d..) for none. log_prob: scores' shape.
void loss_shape(ShapeCtx& c) {
  const std::string reduction = c.attrs().get_string("reduction", "mean");
  if (reduction != "none") {
    c.set(0, Shape::of({}));
  } else {
    Shape per_item = c.in(1);
    const Shape scores = c.in(0);
    if (!per_item.rank_known && scores.rank() >= 2) {
      per_item = scores;
      per_item.dims.erase(per_item.dims.begin() + 1);
    }
    c.set(0, per_item);
  }
  c.set(1, c.in(0));
}

}  // namespace

REGISTER_SHAPE_RULE("Softmax", same_as_input0);
REGISTER_SHAPE_RULE("LogSoftmax", same_as_input0);
REGISTER_SHAPE_RULE("Hardmax", same_as_input0);
REGISTER_SHAPE_RULE("LayerNormalization", layer_norm_shape);
REGISTER_SHAPE_RULE("BatchNormalization", batch_norm_shape);
REGISTER_SHAPE_RULE("InstanceNormalization", same_as_input0);
REGISTER_SHAPE_RULE("GroupNormalization", same_as_input0);
REGISTER_SHAPE_RULE("LpNormalization", same_as_input0);
REGISTER_SHAPE_RULE("MeanVarianceNormalization", same_as_input0);
REGISTER_SHAPE_RULE("LRN", same_as_input0);
REGISTER_SHAPE_RULE("SoftmaxCrossEntropyLoss", loss_shape);
REGISTER_SHAPE_RULE("NegativeLogLikelihoodLoss", loss_shape);

// Ours: BatchNormTraining(X, scale, B, running_mean?, running_var?) -> (Y, new running mean,
// new running var, saved mean, saved inv-std), statistics of shape (C); CrossEntropyLoss (label
// smoothing) has SoftmaxCrossEntropyLoss's inputs and outputs.
REGISTER_SHAPE_RULE_IN(kOurDomain, "BatchNormTraining", batch_norm_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "CrossEntropyLoss", loss_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "SoftmaxGrad", softmax_grad_shape);     // (dY, Y)
REGISTER_SHAPE_RULE_IN(kOurDomain, "LogSoftmaxGrad", softmax_grad_shape);  // (dY, Y)
// (dLoss, log_prob, labels, weights?) -> d scores, the shape of log_prob
REGISTER_SHAPE_RULE_IN(kOurDomain, "SoftmaxCrossEntropyLossGrad", same_as_input1);
// (dLoss, input, labels, weights?) -> d input
REGISTER_SHAPE_RULE_IN(kOurDomain, "NegativeLogLikelihoodLossGrad", same_as_input1);

}  // namespace torch_ort
