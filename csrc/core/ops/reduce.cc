// The reduce family: Reduce*, ArgMax/ArgMin, TopK, CumSum, the softmax ops (a normalisation
// along an axis), and our gradients of them (ReduceSumGrad, ReduceMeanGrad, SumToShape,
// SoftmaxGrad, LogSoftmaxGrad). Kernels: csrc/runtime/kernels/reduce.cc, the gradient ops
// in grad_ops.cc.
// One home per op: its traits line (reduce_ops() below), its shape rule (shapes/shape_rules.h) and
// its gradient rule or the reason it has none (autodiff/gradient_registry.h) are all here.
//
// ReduceSumGrad, ReduceMeanGrad and SumToShape take their output shape from the *values* of
// their shape input (a Shape of the forward value, or a constant).
#include <algorithm>

#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/graph.h"
#include "csrc/core/ops/families.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort::ops {

std::vector<OpEntry> reduce_ops() {
  using enum ViewRule;
  const std::vector<DType> kInt64Out{DType::kInt64};
  return {
      {"", "ArgMax", {.output_dtypes = kInt64Out}},
      {"", "ArgMin", {.output_dtypes = kInt64Out}},
      {"", "CumSum", {.host_inputs = {1}}},  // axis
      {"", "LogSoftmax", {.recomputable = true}},
      // host input 1: axes (opset 18+; ReduceSum 13+)
      {"", "ReduceL1", {.host_inputs = {1}}},
      {"", "ReduceL2", {.host_inputs = {1}}},
      {"", "ReduceLogSum", {.host_inputs = {1}}},
      {"", "ReduceLogSumExp", {.host_inputs = {1}}},
      {"", "ReduceMax", {.host_computable = true, .host_inputs = {1}}},
      {"", "ReduceMean", {.host_computable = true, .host_inputs = {1}, .view = kReduceNoop}},
      {"", "ReduceMin", {.host_computable = true, .host_inputs = {1}}},
      {"", "ReduceProd", {.host_computable = true, .host_inputs = {1}}},
      {"", "ReduceSum", {.host_computable = true, .host_inputs = {1}, .view = kReduceNoop}},
      {"", "ReduceSumSquare", {.host_inputs = {1}}},
      {"", "Softmax", {.recomputable = true}},
      {"", "TopK", {.host_inputs = {1}}},  // K
      // arity: (dY, shape(X), [axes])
      {kOurDomain, "ReduceMeanGrad", {.host_inputs = {1, 2}, .arity = OpArity{2, 3, 1, 1}}},  // shape(X), axes
      {kOurDomain, "ReduceSumGrad", {.host_inputs = {1, 2}, .view = kSpread, .arity = OpArity{2, 3, 1, 1}}},
      // arity: (dY, shape)
      {kOurDomain, "SumToShape", {.host_inputs = {1}, .view = kIfSameShape, .arity = OpArity{2, 2, 1, 1}}},  // shape
      {kOurDomain, "LogSoftmaxGrad", {.arity = OpArity{2, 2, 1, 1}}},  // (dY, Y)
      {kOurDomain, "SoftmaxGrad", {.arity = OpArity{2, 2, 1, 1}}},
  };
}

}  // namespace torch_ort::ops

namespace torch_ort {
namespace {

// --- shape rules (shapes/shape_rules.h)

// Reduce*(X, axes?) with keepdims (default 1) and noop_with_empty_axes (default 0). Axes come
// from input 1 (opset 18; ReduceSum since 13) or the 'axes' attribute of older opsets.
void reduce_shape(ShapeCtx& c) {
  const Shape x = c.in(0);
  const bool keep = c.attrs().get_int("keepdims", 1) != 0;
  const bool noop = c.attrs().get_int("noop_with_empty_axes", 0) != 0;
  if (!x.rank_known) return;
  if (x.rank() == 0) return c.set(0, x);  // torch reduces a scalar over dim 0 or -1: still a scalar
  std::optional<std::vector<int64_t>> axes =
      c.has_in(1) ? c.ints(1) : std::optional(c.attrs().get_ints("axes", {}));
  if (!axes) {  // axes known only at run time: with keepdims the rank survives, each dim 1 or kept
    if (!keep) return;
    Shape out = unknown_dims(x.rank());
    for (size_t d = 0; d < x.dims.size(); ++d)
      if (x.dims[d].is_known() && x.dims[d].value == 1) out.dims[d] = Dim::known(1);
    return c.set(0, out);
  }
  if (axes->empty() && noop) return c.set(0, x);
  std::vector<bool> reduced(x.dims.size(), axes->empty());
  for (int64_t a : *axes) reduced[norm_axis(c, a, x.rank())] = true;
  Shape out = Shape::of({});
  for (size_t d = 0; d < x.dims.size(); ++d) {
    if (!reduced[d]) out.dims.push_back(x.dims[d]);
    else if (keep) out.dims.push_back(Dim::known(1));
  }
  c.set(0, out);
}

// ArgMax/ArgMin(X): one axis (default 0), keepdims default 1.
void arg_reduce_shape(ShapeCtx& c) {
  Shape x = c.in(0);
  if (!x.rank_known || x.rank() == 0) return c.set(0, x);
  const int64_t axis = norm_axis(c, c.attrs().get_int("axis", 0), x.rank());
  if (c.attrs().get_int("keepdims", 1) != 0) x.dims[axis] = Dim::known(1);
  else x.dims.erase(x.dims.begin() + axis);
  c.set(0, x);
}

// (dY, shape, axes?) -> a tensor of the shape `shape` holds (the forward input's).
void from_shape_input1(ShapeCtx& c) { c.set(0, shape_from_values(c, 1)); }

// TopK(X, K) -> (values, indices): X's shape with dim `axis` = K.
void topk_shape(ShapeCtx& c) {
  Shape x = c.in(0);
  if (!x.rank_known) return;
  const int64_t axis = norm_axis(c, c.attrs().get_int("axis", -1), x.rank());
  const SymValues* k = c.values(1);
  x.dims[axis] = k && k->size() == 1 && (*k)[0] ? (*k)[0]->to_dim() : Dim{};
  c.set(0, x);
  c.set(1, x);
}


// Our (dY, Y) gradients of softmax-like ops: the common shape of both.
void softmax_grad_shape(ShapeCtx& c) { c.set(0, broadcast(c, c.in(0), c.in(1))); }

// --- gradient rules (autodiff/gradient_registry.h)

// Reductions: dX = dY broadcast back over the reduced axes (÷ count for the mean).
// Axes come from the 'axes' input (opset 18; ReduceSum since 13) or the older attribute.
// kNoValue when the op was an identity (no axes, noop_with_empty_axes).
ValueId spread_over_axes(GradCtx& g, ValueId dy, const char* grad_op) {
  const bool noop = g.attrs().get_int("noop_with_empty_axes", 0) != 0;
  Attributes a;
  a.set("keepdims", g.attrs().get_int("keepdims", 1));
  std::vector<ValueId> ins{dy, g.shape_of(g.in(0))};
  if (g.has_in(1) && !g.is_const(1)) {  // axes known only at run time: the kernel reads them
    a.set("noop_with_empty_axes", int64_t{noop});
    ins.push_back(g.in(1));
  } else {
    std::vector<int64_t> axes = g.has_in(1) ? g.const_ints(1) : g.attrs().get_ints("axes", {});
    if (axes.empty() && noop) return kNoValue;
    a.set("axes", axes);
  }
  return g.ours(grad_op, std::move(ins), std::move(a), DType::kUndefined, g.info(g.in(0)).shape);
}

void reduce_grad(GradCtx& g, const char* grad_op) {
  const ValueId dx = spread_over_axes(g, g.grad_out(0), grad_op);
  g.set_grad(0, dx == kNoValue ? g.grad_out(0) : dx);
}

void reduce_sum_grad(GradCtx& g) { reduce_grad(g, "ReduceSumGrad"); }

void reduce_mean_grad(GradCtx& g) { reduce_grad(g, "ReduceMeanGrad"); }

// ReduceL2 (torch's vector norm, p = 2): dX = X · dY / Y, 0 where Y is 0 (torch's subgradient).
void reduce_l2_grad(GradCtx& g) {
  const ValueId y = g.out(0);
  const ValueId zero = g.const_scalar(0.0, g.info(y).dtype);
  const ValueId q = g.op("Where", {g.op("Equal", {y, zero}), zero, g.div(g.grad_out(0), y)});
  const ValueId spread = spread_over_axes(g, q, "ReduceSumGrad");
  if (spread == kNoValue) return g.set_grad(0, g.grad_out(0));  // the op was an identity
  g.set_grad(0, g.mul(g.in(0), spread));
}

// dX = the running sum of dY in the other direction: X_j enters every Y_i with i >= j (i > j when
// exclusive), so dX_j sums dY over those i: CumSum(dY) with `reverse` flipped, `exclusive` kept.
void cumsum_grad(GradCtx& g) {
  Attributes a = g.attrs();
  a.set("reverse", int64_t{a.get_int("reverse", 0) == 0});
  g.set_grad(0, g.op("CumSum", {g.grad_out(0), g.in(1)}, std::move(a), DType::kUndefined, g.info(g.in(0)).shape));
}

// TopK: dX = zeros(shape(X)) with dValues added at the indices along axis (GatherElements' gradient op).
void topk_grad(GradCtx& g) {
  Attributes a;
  a.set("axis", g.attrs().get_int("axis", -1));
  g.set_grad(0, g.ours("GatherElementsGrad", {g.grad_out(0), g.shape_of(g.in(0)), g.out(1)}, std::move(a),
                       DType::kUndefined, g.info(g.in(0)).shape));
}

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

}  // namespace

REGISTER_SHAPE_RULE("ReduceSum", reduce_shape);
REGISTER_SHAPE_RULE("ReduceMean", reduce_shape);
REGISTER_SHAPE_RULE("ReduceMax", reduce_shape);
REGISTER_SHAPE_RULE("ReduceMin", reduce_shape);
REGISTER_SHAPE_RULE("ReduceProd", reduce_shape);
REGISTER_SHAPE_RULE("ReduceL1", reduce_shape);
REGISTER_SHAPE_RULE("ReduceL2", reduce_shape);
REGISTER_SHAPE_RULE("ReduceLogSum", reduce_shape);
REGISTER_SHAPE_RULE("ReduceLogSumExp", reduce_shape);
REGISTER_SHAPE_RULE("ReduceSumSquare", reduce_shape);
REGISTER_SHAPE_RULE("ArgMax", arg_reduce_shape);
REGISTER_SHAPE_RULE("ArgMin", arg_reduce_shape);
REGISTER_SHAPE_RULE("TopK", topk_shape);
REGISTER_SHAPE_RULE("CumSum", same_as_input0);
REGISTER_SHAPE_RULE("Softmax", same_as_input0);
REGISTER_SHAPE_RULE("LogSoftmax", same_as_input0);
REGISTER_SHAPE_RULE("Hardmax", same_as_input0);

// Our gradient ops (com.torch_ort).
REGISTER_SHAPE_RULE_IN(kOurDomain, "ReduceSumGrad", from_shape_input1);   // (dY, shape(X), axes?)
REGISTER_SHAPE_RULE_IN(kOurDomain, "ReduceMeanGrad", from_shape_input1);  // (dY, shape(X), axes?)
REGISTER_SHAPE_RULE_IN(kOurDomain, "SumToShape", from_shape_input1);      // (dY, shape)
REGISTER_SHAPE_RULE_IN(kOurDomain, "SoftmaxGrad", softmax_grad_shape);     // (dY, Y)
REGISTER_SHAPE_RULE_IN(kOurDomain, "LogSoftmaxGrad", softmax_grad_shape);  // (dY, Y)

REGISTER_GRADIENT("ReduceSum", reduce_sum_grad, {1});
REGISTER_GRADIENT("ReduceMean", reduce_mean_grad, {1});
REGISTER_GRADIENT("ReduceL2", reduce_l2_grad, {1});
REGISTER_GRADIENT("CumSum", cumsum_grad, {1});  // axis
REGISTER_GRADIENT("Softmax", softmax_grad, {});
REGISTER_GRADIENT("LogSoftmax", log_softmax_grad, {});
REGISTER_GRADIENT("TopK", topk_grad, {1});  // K

NO_GRADIENT("ArgMax", "integer output");
NO_GRADIENT("ArgMin", "integer output");

}  // namespace torch_ort
