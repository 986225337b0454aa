// The nn family: layer normalisation (and LpNormalization, MeanVarianceNormalization), the
// losses the exporter emits for F.cross_entropy (SoftmaxCrossEntropyLoss, ours CrossEntropyLoss
// when label smoothing is on) and F.nll_loss, our LinearCrossEntropy (an LM head fused with its
// loss), our Embedding, and our gradients of them.
// Kernels: csrc/runtime/kernels/nn*.cc.
// One home per op: its traits line (nn_ops() below), its shape rule (shapes/shape_rules.h) and
// its gradient rule or the reason it has none (autodiff/gradient_registry.h) are all here.
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/graph.h"
#include "csrc/core/ops/families.h"
#include "csrc/core/ops/nn.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort::ops {
namespace {

// LayerNormalization: backward reads the forward's Mean and InvStdDev (outputs 1, 2), one per
// normalised row: X's dims before `axis`, 1s after; float unless X is double (stash_type 1).
void add_layer_norm_statistics(Graph& g, Node& n) {
  const Value x = g.value(n.inputs[0]);
  Shape s = Shape::unknown();
  if (x.shape.rank_known && x.shape.rank() > 0) {
    const int64_t r = x.shape.rank(), axis = n.attrs.get_int("axis", -1);
    s = x.shape;
    for (int64_t d = axis < 0 ? axis + r : axis; d >= 0 && d < r; ++d) s.dims[d] = Dim::known(1);
  }
  const DType st = n.attrs.get_int("stash_type", 1) == 1 && x.dtype != DType::kDouble ? DType::kFloat : x.dtype;
  n.outputs.resize(3, kNoValue);
  for (int i : {1, 2})
    if (n.outputs[i] == kNoValue)
      n.outputs[i] = g.new_value(g.value(n.outputs[0]).name + (i == 1 ? "/mean" : "/inv_std_dev"), st, s);
}

// The losses: their gradient is softmax − onehot, computed from log_prob (output 1).
void add_log_prob(Graph& g, Node& n) {
  if (n.outputs.size() >= 2 && n.outputs[1] != kNoValue) return;
  const Value& scores = g.value(n.inputs[0]);
  const ValueId lp = g.new_value(g.value(n.outputs[0]).name + "/log_prob", scores.dtype, scores.shape);
  n.outputs.resize(2, kNoValue);
  n.outputs[1] = lp;
}

// LinearCrossEntropy: its gradients are computed in forward, chunk by chunk, as outputs 1-3 (dX,
// dW, dbias of the loss itself); backward scales them. Output k + 1 is shaped and typed as input k.
void add_unit_gradients(Graph& g, Node& n) {
  n.outputs.resize(4, kNoValue);
  const std::string base = g.value(n.outputs[0]).name;
  for (int i = 0; i < 3; ++i) {
    if (n.outputs[i + 1] != kNoValue || i >= static_cast<int>(n.inputs.size()) || n.inputs[i] == kNoValue) continue;
    const Value in = g.value(n.inputs[i]);
    n.outputs[i + 1] = g.new_value(base + (i == 0 ? "/dX" : i == 1 ? "/dW" : "/dbias"), in.dtype, in.shape);
  }
}

}  // namespace

std::vector<OpEntry> nn_ops() {
  return {
      // Mean and InvStdDev (outputs 1, 2) for the gradient.
      {"", "LayerNormalization", {.recomputable = true, .add_outputs_for_gradient = add_layer_norm_statistics}},
      // Its log-probabilities (output 1, B·T·vocab) for the gradient softmax − onehot; recomputed
      // from the logits (a graph output).
      {"", "SoftmaxCrossEntropyLoss", {.recomputable = true, .add_outputs_for_gradient = add_log_prob}},
      // arity: (scores, labels, [weights]) -> (loss, [log_prob])
      {kOurDomain, "CrossEntropyLoss", {.add_outputs_for_gradient = add_log_prob, .arity = OpArity{2, 3, 1, 2}}},
      // arity: (dY, indices, shape(W))
      // (dY, indices, shape(W)[, accumulator]): see GatherGrad
      {kOurDomain, "EmbeddingGrad", {.host_inputs = {2}, .inplace_inputs = {3}, .arity = OpArity{3, 4, 1, 1}}},
      {kOurDomain, "CrossEntropyLossGrad", {.arity = OpArity{3, 4, 1, 1}}},  // (dLoss, log_prob, labels, [weights])
      {kOurDomain, "Embedding", {.arity = OpArity{2, 2, 1, 1}}},  // (weight, indices)
      // (X (N, H), W, [bias], labels (N), [Full], [rows]) -> (loss, [dX], [dW], [dbias]): the LM head
      // and its loss in chunks of rows (passes/linear_cross_entropy_fusion.cc). Its gradients
      // are made in forward (add_unit_gradients); an unread one is dropped (dce).
      {kOurDomain, "LinearCrossEntropy", {.add_outputs_for_gradient = add_unit_gradients, .arity = OpArity{4, 6, 1, 4, slots({2}), slots({1, 2, 3})}}},
      {kOurDomain, "LossGradientScale", {.arity = OpArity{2, 2, 1, 1}}},  // (unit gradient, dLoss)
      {kOurDomain, "LayerNormalizationGrad", {.arity = OpArity{5, 5, 1, 1}}},  // (dY, X, Scale, Mean, InvStdDev)
      {kOurDomain, "LayerNormalizationScaleGrad", {.arity = OpArity{5, 5, 1, 1}}},
      {kOurDomain, "NegativeLogLikelihoodLossGrad", {.arity = OpArity{3, 4, 1, 1}}},  // (dLoss, input, labels, [weights])
      {kOurDomain, "SoftmaxCrossEntropyLossGrad", {.arity = OpArity{3, 4, 1, 1}}},  // (dLoss, log_prob, labels, [weights])
  };
}

}  // namespace torch_ort::ops

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

// --- shape rules (shapes/shape_rules.h)


void same_as_input1(ShapeCtx& c) { c.set(0, c.in(1)); }

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

// LinearCrossEntropy(X, W, [bias], labels, ...) -> (loss [] (mean or sum), dX, dW, dbias like X, W, bias)
void linear_cross_entropy_shape(ShapeCtx& c) {
  c.set(0, Shape::of({}));
  for (int i = 0; i < 3; ++i)
    if (c.has_in(i) && i + 1 < c.num_outputs()) c.set(i + 1, c.in(i));
}

// Our Embedding(weight (V, D...), indices) -> indices' shape + D...
void embedding_shape(ShapeCtx& c) {
  const Shape w = c.in(0), idx = c.in(1);
  if (!w.rank_known || !idx.rank_known || w.rank() < 1) return;
  Shape out = idx;
  out.dims.insert(out.dims.end(), w.dims.begin() + 1, w.dims.end());
  c.set(0, out);
}


// --- gradient rules (autodiff/gradient_registry.h)

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

// LinearCrossEntropy: forward made the loss's own gradients (d loss = 1) as outputs 1-3; each
// needed one is scaled by the incoming gradient (a scalar: the loss is a mean or a sum), in
// LossGradientScale, which passes the gradient through when d loss is 1 on the host.
void linear_cross_entropy_grad(GradCtx& g) {
  for (int i = 0; i < 3; ++i) {
    if (!g.has_in(i) || !g.needs(i)) continue;
    const ValueId unit = g.out(i + 1);
    g.set_grad(i, g.ours("LossGradientScale", {unit, g.grad_out(0)}, {}, g.info(unit).dtype, g.info(unit).shape));
  }
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

REGISTER_SHAPE_RULE("LayerNormalization", layer_norm_shape);
REGISTER_SHAPE_RULE("LpNormalization", same_as_input0);
REGISTER_SHAPE_RULE("MeanVarianceNormalization", same_as_input0);
REGISTER_SHAPE_RULE("SoftmaxCrossEntropyLoss", loss_shape);
REGISTER_SHAPE_RULE("NegativeLogLikelihoodLoss", loss_shape);
// Ours: CrossEntropyLoss (label smoothing) has SoftmaxCrossEntropyLoss's inputs and outputs.
REGISTER_SHAPE_RULE_IN(kOurDomain, "CrossEntropyLoss", loss_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "Embedding", embedding_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "LinearCrossEntropy", linear_cross_entropy_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "LossGradientScale", same_as_input0);
// (dLoss, log_prob, labels, weights?) -> d scores, the shape of log_prob
REGISTER_SHAPE_RULE_IN(kOurDomain, "SoftmaxCrossEntropyLossGrad", same_as_input1);
// (dLoss, input, labels, weights?) -> d input
REGISTER_SHAPE_RULE_IN(kOurDomain, "NegativeLogLikelihoodLossGrad", same_as_input1);
// Declared by the gradient builder when it emits them.
REGISTER_SHAPE_RULE_IN(kOurDomain, "LayerNormalizationGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "LayerNormalizationScaleGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "EmbeddingGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "CrossEntropyLossGrad", declared_by_gradient_builder);

REGISTER_GRADIENT("LayerNormalization", layer_norm_grad, {});
REGISTER_GRADIENT("SoftmaxCrossEntropyLoss", softmax_cross_entropy_grad, {1, 2});
REGISTER_GRADIENT("NegativeLogLikelihoodLoss", nll_loss_grad, {1, 2});
REGISTER_GRADIENT_IN(kOurDomain, "CrossEntropyLoss", softmax_cross_entropy_grad, {1, 2});
REGISTER_GRADIENT_IN(kOurDomain, "Embedding", embedding_grad, {1});
REGISTER_GRADIENT_IN(kOurDomain, "LinearCrossEntropy", linear_cross_entropy_grad, {3, 4, 5});

}  // namespace torch_ort
