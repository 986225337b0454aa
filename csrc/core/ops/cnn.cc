// The cnn family: convolutions, pooling, batch normalization (and the other image
// normalisations), and our gradients of them. Kernels: csrc/runtime/kernels/cnn_*.cc.
// One home per op: its traits line (cnn_ops() below), its shape rule (shapes/shape_rules.h) and
// its gradient rule or the reason it has none (autodiff/gradient_registry.h) are all here.
//
// Window sizes on symbolic dims stay symbolic where they are a cheap expression of the input
// size (stride 1: "h-2"; otherwise the floor-division atom "((h-3)//2)+1"), so they check at
// run time like any other derived dim. Each gradient rule emits one gradient op of ours whose
// kernel calls ATen's backward (the one eager autograd uses); a rule that yields several input
// gradients emits one node computing only those that are needed.
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/limits.h"
#include "csrc/core/ops/families.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort::ops {
namespace {

// MaxPool's gradient adds dY at the forward's argmax: its Indices (output 1).
void add_maxpool_indices(Graph& g, Node& n) {
  if (n.outputs.size() >= 2 && n.outputs[1] != kNoValue) return;
  const ValueId idx = g.new_value(g.value(n.outputs[0]).name + "/indices", DType::kInt64, g.value(n.outputs[0]).shape);
  n.outputs.resize(2, kNoValue);
  n.outputs[1] = idx;
}

}  // namespace

std::vector<OpEntry> cnn_ops() {
  return {
      // Indices (output 1): the gradient adds dY at the forward's argmax.
      {"", "MaxPool", {.output_dtypes = {DType::kUndefined, DType::kInt64}, .add_outputs_for_gradient = add_maxpool_indices}},
      // arity: (dY, shape(X))
      {kOurDomain, "AveragePoolGrad", {.host_inputs = {1}, .arity = OpArity{2, 2, 1, 1}}},  // shape(X)
      // arity: (dY, Indices, shape(X))
      {kOurDomain, "MaxPoolGrad", {.host_inputs = {2}, .arity = OpArity{3, 3, 1, 1}}},  // shape(X)
      // (X, [scale], [B], [mean], [var]) -> (Y, [mean], [var], [saved mean], [saved inv-std])
      {kOurDomain, "BatchNormTraining", {.arity = OpArity{1, 5, 1, 5}}},
      // (dY, X, [scale], [mean], [var | inv-std]) -> ([dX], [dScale], [dB])
      {kOurDomain, "BatchNormalizationGrad", {.arity = OpArity{2, 5, 3, 3, 0, slots({0, 1, 2})}}},
      {kOurDomain, "ConvGrad", {.arity = OpArity{3, 3, 3, 3, 0, slots({0, 1, 2})}}},  // (dY, X, W) -> ([dX], [dW], [dB])
      {kOurDomain, "ConvTransposeGrad", {.arity = OpArity{3, 3, 3, 3, 0, slots({0, 1, 2})}}},
      {kOurDomain, "GlobalMaxPoolGrad", {.arity = OpArity{3, 3, 1, 1}}},  // (dY, X, Y)
  };
}

}  // namespace torch_ort::ops

namespace torch_ort {
namespace {

// --- shape rules (shapes/shape_rules.h)

SymInt expr(const Dim& d) { return SymExpr::of(d); }

// One spatial output size: floor((d + pads - (dil·(k−1)+1)) / s) + 1 (ceil with ceil_mode), or
// ceil(d / s) for SAME_* padding. Attribute arithmetic is checked (checked_*, SymExpr): an
// overflow throws and run_shape_rule leaves the output unknown.
Dim window_out(const Dim& d, int64_t k, int64_t s, int64_t dil, int64_t pb, int64_t pe,
               const std::string& auto_pad, bool ceil_mode) {
  const SymInt x = expr(d);
  if (!x || s <= 0) return Dim{};
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER")
    return dim_floordiv((*x + SymExpr::constant(s - 1)).to_dim(), Dim::known(s));
  if (auto_pad == "VALID") pb = pe = 0;
  const int64_t eff = checked_add(checked_mul(dil, checked_sub(k, 1)), 1);
  const int64_t room = checked_sub(checked_add(pb, pe), eff);  // pads − window extent
  if (ceil_mode) {  // the last window must start inside the input or its left padding
    if (!d.is_known()) return Dim{};
    int64_t o = checked_add(checked_add(d.value, room), s - 1) / s + 1;
    if (checked_mul(o - 1, s) >= checked_add(d.value, pb)) --o;
    return o >= 0 ? Dim::known(o) : Dim{};
  }
  const SymInt q = expr(dim_floordiv((*x + SymExpr::constant(room)).to_dim(), Dim::known(s)));
  return q ? (*q + SymExpr::constant(1)).to_dim() : Dim{};
}

// Conv / pooling: (N, C, d1..dn) -> (N, channels, o1..on).
void window_shape(ShapeCtx& c, const Dim& channels, std::vector<int64_t> kernel, bool ceil_mode) {
  const Shape x = c.in(0);
  if (!x.rank_known || x.rank() < 3) return;
  const size_t n = x.dims.size() - 2;
  const auto strides = c.attrs().get_ints("strides", std::vector<int64_t>(n, 1));
  const auto dil = c.attrs().get_ints("dilations", std::vector<int64_t>(n, 1));
  const auto pads = c.attrs().get_ints("pads", std::vector<int64_t>(2 * n, 0));
  const std::string auto_pad = c.attrs().get_string("auto_pad", "NOTSET");
  const bool sizes_known =
      kernel.size() == n && strides.size() == n && dil.size() == n && pads.size() == 2 * n;
  Shape out = Shape::of({x.dims[0], channels});
  for (size_t i = 0; i < n; ++i)
    out.dims.push_back(sizes_known ? window_out(x.dims[2 + i], kernel[i], strides[i], dil[i], pads[i],
                                                pads[n + i], auto_pad, ceil_mode)
                                   : Dim{});
  c.set(0, out);
}

std::vector<int64_t> kernel_of(const ShapeCtx& c, const Shape& w) {
  std::vector<int64_t> k = c.attrs().get_ints("kernel_shape", {});
  if (!k.empty() || !w.rank_known) return k;
  for (size_t i = 2; i < w.dims.size(); ++i) {
    if (!w.dims[i].is_known()) return {};
    k.push_back(w.dims[i].value);
  }
  return k;
}

void conv_shape(ShapeCtx& c) {  // X (N, C, d..), W (M, C/group, k..), B (M)
  const Shape w = c.in(1);
  window_shape(c, w.rank_known && w.rank() >= 1 ? w.dims[0] : Dim{}, kernel_of(c, w), false);
}

void pool_shape(ShapeCtx& c) {  // MaxPool also returns Indices of the output's shape
  const Shape x = c.in(0);
  window_shape(c, x.rank() >= 2 ? x.dims[1] : Dim{}, c.attrs().get_ints("kernel_shape", {}),
               c.attrs().get_int("ceil_mode", 0) != 0);
  if (c.num_outputs() >= 2) c.set(1, c.out_shapes[0]);  // (a node may name no outputs at all)
}

void global_pool_shape(ShapeCtx& c) {  // (N, C, d..) -> (N, C, 1..)
  Shape x = c.in(0);
  if (!x.rank_known || x.rank() < 2) return;
  for (size_t i = 2; i < x.dims.size(); ++i) x.dims[i] = Dim::known(1);
  c.set(0, x);
}

// ConvTranspose: o = s·(d−1) + output_padding + dil·(k−1) + 1 − pads; channels = W[1]·group.
void conv_transpose_shape(ShapeCtx& c) {
  const Shape x = c.in(0), w = c.in(1);
  if (!x.rank_known || x.rank() < 3) return;
  const size_t n = x.dims.size() - 2;
  const Dim ch = w.rank() >= 2 ? dim_mul(w.dims[1], Dim::known(c.attrs().get_int("group", 1))) : Dim{};
  Shape out = Shape::of({x.dims[0], ch});
  const auto explicit_out = c.attrs().get_ints("output_shape", {});
  const auto k = kernel_of(c, w);
  const auto s = c.attrs().get_ints("strides", std::vector<int64_t>(n, 1));
  const auto dil = c.attrs().get_ints("dilations", std::vector<int64_t>(n, 1));
  const auto op = c.attrs().get_ints("output_padding", std::vector<int64_t>(n, 0));
  const auto pads = c.attrs().get_ints("pads", std::vector<int64_t>(2 * n, 0));
  const bool auto_pad = c.attrs().get_string("auto_pad", "NOTSET") != "NOTSET";
  for (size_t i = 0; i < n; ++i) {
    if (explicit_out.size() == n) { out.dims.push_back(Dim::known(explicit_out[i])); continue; }
    const SymInt d = expr(x.dims[2 + i]);
    if (!d || auto_pad || k.size() != n || s.size() != n || dil.size() != n || op.size() != n ||
        pads.size() != 2 * n) { out.dims.push_back(Dim{}); continue; }
    const int64_t add = checked_sub(
        checked_sub(checked_add(checked_add(op[i], checked_mul(dil[i], checked_sub(k[i], 1))), 1),
                    checked_add(pads[i], pads[n + i])),
        s[i]);
    out.dims.push_back((SymExpr::constant(s[i]) * *d + SymExpr::constant(add)).to_dim());
  }
  c.set(0, out);
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


// --- gradient rules (autodiff/gradient_registry.h)

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

REGISTER_SHAPE_RULE("Conv", conv_shape);
REGISTER_SHAPE_RULE("ConvTranspose", conv_transpose_shape);
REGISTER_SHAPE_RULE("MaxPool", pool_shape);
REGISTER_SHAPE_RULE("AveragePool", pool_shape);
REGISTER_SHAPE_RULE("LpPool", pool_shape);
REGISTER_SHAPE_RULE("GlobalAveragePool", global_pool_shape);
REGISTER_SHAPE_RULE("GlobalMaxPool", global_pool_shape);
REGISTER_SHAPE_RULE("GlobalLpPool", global_pool_shape);
REGISTER_SHAPE_RULE("BatchNormalization", batch_norm_shape);
REGISTER_SHAPE_RULE("InstanceNormalization", same_as_input0);
REGISTER_SHAPE_RULE("GroupNormalization", same_as_input0);
REGISTER_SHAPE_RULE("LRN", same_as_input0);
// Ours: BatchNormTraining(X, scale, B, running_mean?, running_var?) -> (Y, new running mean,
// new running var, saved mean, saved inv-std), statistics of shape (C).
REGISTER_SHAPE_RULE_IN(kOurDomain, "BatchNormTraining", batch_norm_shape);
// Declared by the gradient builder when it emits them.
REGISTER_SHAPE_RULE_IN(kOurDomain, "ConvGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "ConvTransposeGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "MaxPoolGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "AveragePoolGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "GlobalMaxPoolGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "BatchNormalizationGrad", declared_by_gradient_builder);

REGISTER_GRADIENT("Conv", conv_grad, {});
REGISTER_GRADIENT("ConvTranspose", conv_transpose_grad, {});
REGISTER_GRADIENT("MaxPool", max_pool_grad, {});
REGISTER_GRADIENT("AveragePool", average_pool_grad, {});
REGISTER_GRADIENT("GlobalAveragePool", global_average_pool_grad, {});
REGISTER_GRADIENT("GlobalMaxPool", global_max_pool_grad, {});
REGISTER_GRADIENT("BatchNormalization", batch_norm_grad, {3, 4});  // running statistics
REGISTER_GRADIENT_IN(kOurDomain, "BatchNormTraining", batch_norm_training_grad, {3, 4});

}  // namespace torch_ort
