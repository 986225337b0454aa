// Gradient rules of the CNN ops: convolutions, pools and batch normalization. Each emits one
// gradient op of ours whose kernel calls ATen's backward (the one eager autograd uses); a rule
// that yields several input gradients emits one node computing only those that are needed.
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"

namespace torch_ort {
namespace {

// The forward inputs whose gradients are wanted, kNoValue elsewhere (ours_multi's `like`).
std::vector<ValueId> needed(GradCtx& g, int n) {
  std::vector<ValueId> like;
  for (int i = 0; i < n; ++i) like.push_back(g.needs(i) ? g.in(i) : kNoValue);
  return like;
}

void set_grads(GradCtx& g, const std::vector<ValueId>& grads) {
  for (int i = 0; i < static_cast<int>(grads.size()); ++i)
    if (grads[i] != kNoValue) g.set_grad(i, grads[i]);
}

// (dX, dW, dB) = ConvGrad(dY, X, W): dX = conv_transpose(dY, W), dW = conv(X, dY), dB = Σ dY.
// The forward's attributes travel along; the kernel resolves pads against X's shape again.
void conv_grad(GradCtx& g) {
  set_grads(g, g.ours_multi("ConvGrad", {g.grad_out(0), g.in(0), g.in(1)}, needed(g, 3), g.attrs()));
}
// The adjoint of the above: dX = conv(dY, W), dW = conv(dY, X), dB = Σ dY.
void conv_transpose_grad(GradCtx& g) {
  set_grads(g, g.ours_multi("ConvTransposeGrad", {g.grad_out(0), g.in(0), g.in(1)}, needed(g, 3), g.attrs()));
}

// dX = dY added at each output's argmax: the forward's Indices output (requested by the
// autodiff, see request_forward_outputs), so backward reads neither X nor Y, only X's shape.
void max_pool_grad(GradCtx& g) {
  if (g.attrs().get_int("storage_order", 0) != 0)
    throw GradientError(g.node().describe() + ": the gradient of MaxPool with storage_order=1 is not supported");
  g.set_grad(0, g.ours("MaxPoolGrad", {g.grad_out(0), g.out(1), g.shape_of(g.in(0))}, {},
                       DType::kUndefined, g.info(g.in(0)).shape));
}

// dX = Σ over the windows holding x of dY / window count (ATen's avg_pool backward).
void average_pool_grad(GradCtx& g) {
  g.set_grad(0, g.ours("AveragePoolGrad", {g.grad_out(0), g.shape_of(g.in(0))}, g.attrs(),
                       DType::kUndefined, g.info(g.in(0)).shape));
}

// GlobalAveragePool is ReduceMean over the spatial axes with keepdims: dX = dY / (D1·…·Dn).
void global_average_pool_grad(GradCtx& g) {
  std::vector<int64_t> axes;
  for (int64_t d = 2; d < g.rank(g.in(0)); ++d) axes.push_back(d);
  Attributes a;
  a.set("axes", axes);
  a.set("keepdims", int64_t{1});
  g.set_grad(0, g.ours("ReduceMeanGrad", {g.grad_out(0), g.shape_of(g.in(0))}, std::move(a),
                       DType::kUndefined, g.info(g.in(0)).shape));
}

// dX = dY · [X == Y] / #ties (ATen's amax rule).
void global_max_pool_grad(GradCtx& g) {
  g.set_grad(0, g.ours("GlobalMaxPoolGrad", {g.grad_out(0), g.in(0), g.out(0)}, {}, DType::kUndefined,
                       g.info(g.in(0)).shape));
}

Attributes bn_grad_attrs(const GradCtx& g, bool training) {
  Attributes a;
  a.set("epsilon", g.attrs().get_float("epsilon", 1e-5f));
  a.set("training", int64_t{training});
  return a;
}

// ONNX BatchNormalization. Inference: Y = scale·(X − mean)/√(var + ε) + B with the given
// statistics, so dX = dY·scale/√(var + ε). training_mode=1: the batch statistics depend on X
// too; the op keeps no saved statistics, so BatchNormalizationGrad recomputes them from X.
// Gradients of the running-statistics outputs are ignored: buffers, not activations.
void batch_norm_grad(GradCtx& g) {
  const bool training = g.opset() >= 14 && g.attrs().get_int("training_mode", 0) != 0;
  std::vector<ValueId> ins{g.grad_out(0), g.in(0), g.in(1)};
  if (!training) ins.insert(ins.end(), {g.in(3), g.in(4)});
  set_grads(g, g.ours_multi("BatchNormalizationGrad", std::move(ins), needed(g, 3), bn_grad_attrs(g, training)));
}

// Our BatchNormTraining: the batch-statistics gradient from the forward's saved mean and inv-std
// (outputs 3 and 4, which our translation always emits), exactly what eager's
// native_batch_norm_backward gets; a node without them has the statistics recomputed from X.
void batch_norm_training_grad(GradCtx& g) {
  const auto& outs = g.node().outputs;
  const bool saved = outs.size() > 4 && outs[3] != kNoValue && outs[4] != kNoValue;
  std::vector<ValueId> ins{g.grad_out(0), g.in(0), g.has_in(1) ? g.in(1) : kNoValue};
  if (saved) ins.insert(ins.end(), {outs[3], outs[4]});
  set_grads(g, g.ours_multi("BatchNormalizationGrad", std::move(ins), needed(g, 3), bn_grad_attrs(g, true)));
}

}  // namespace

REGISTER_GRADIENT("Conv", conv_grad, {});
REGISTER_GRADIENT("ConvTranspose", conv_transpose_grad, {});
REGISTER_GRADIENT("MaxPool", max_pool_grad, {});
REGISTER_GRADIENT("AveragePool", average_pool_grad, {});
REGISTER_GRADIENT("GlobalAveragePool", global_average_pool_grad, {});
REGISTER_GRADIENT("GlobalMaxPool", global_max_pool_grad, {});
REGISTER_GRADIENT("BatchNormalization", batch_norm_grad, {3, 4});  // running statistics
REGISTER_GRADIENT_IN(kOurDomain, "BatchNormTraining", batch_norm_training_grad, {3, 4});

}  // namespace torch_ort
