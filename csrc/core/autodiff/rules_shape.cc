// Gradient rules of shape and reduction ops, and the ops whose outputs carry no gradient.
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"

namespace torch_ort {
namespace {

// Every op that only moves elements around: dX = reshape(dY, shape(X)).
void reshape_like_input_grad(GradCtx& g) {
  Attributes a;
  a.set("allowzero", int64_t{1});  // X's shape is literal: a 0 is a size, not "copy this dim"
  g.set_grad(0, g.op("Reshape", {g.grad_out(0), g.shape_of(g.in(0))}, std::move(a), DType::kUndefined,
                     g.info(g.in(0)).shape));
}

void transpose_grad(GradCtx& g) {  // dX = transpose(dY, perm⁻¹)
  std::vector<int64_t> perm = g.attrs().get_ints("perm", {});
  if (perm.empty())
    for (int64_t i = g.rank(g.in(0)) - 1; i >= 0; --i) perm.push_back(i);
  // perm must be a permutation of the axes (negative ones count from the end) to be inverted.
  const auto n = static_cast<int64_t>(perm.size());
  const Shape& xs = g.info(g.in(0)).shape;
  const int64_t rank = xs.rank_known ? xs.rank() : -1;
  std::vector<int64_t> inv(perm.size(), -1);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = perm[static_cast<size_t>(i)] < 0 ? perm[static_cast<size_t>(i)] + n : perm[static_cast<size_t>(i)];
    if ((rank >= 0 && rank != n) || p < 0 || p >= n || inv[static_cast<size_t>(p)] >= 0)
      throw GradientError(g.node().describe() + ": perm is not a permutation of the " +
                          std::to_string(rank >= 0 ? rank : n) + " axes of its input");
    inv[static_cast<size_t>(p)] = i;
  }
  g.set_grad(0, g.transpose(g.grad_out(0), inv));
}

void expand_grad(GradCtx& g) {  // dX = dY summed to X's shape
  g.set_grad(0, g.sum_to_shape_of(g.grad_out(0), g.in(0)));
}

// Reductions: dX = dY broadcast back over the reduced axes (÷ count for the mean).
// Axes come from the 'axes' input (opset 18; ReduceSum since 13) or the older attribute.
void reduce_grad(GradCtx& g, const char* grad_op) {
  const bool noop = g.attrs().get_int("noop_with_empty_axes", 0) != 0;
  Attributes a;
  a.set("keepdims", g.attrs().get_int("keepdims", 1));
  std::vector<ValueId> ins{g.grad_out(0), g.shape_of(g.in(0))};
  if (g.has_in(1) && !g.is_const(1)) {  // axes known only at run time: the kernel reads them
    a.set("noop_with_empty_axes", int64_t{noop});
    ins.push_back(g.in(1));
  } else {
    std::vector<int64_t> axes = g.has_in(1) ? g.const_ints(1) : g.attrs().get_ints("axes", {});
    if (axes.empty() && noop) return g.set_grad(0, g.grad_out(0));  // the op was an identity
    a.set("axes", axes);
  }
  g.set_grad(0, g.ours(grad_op, std::move(ins), std::move(a), DType::kUndefined, g.info(g.in(0)).shape));
}
void reduce_sum_grad(GradCtx& g) { reduce_grad(g, "ReduceSumGrad"); }

// dX = the running sum of dY in the other direction: X_j enters every Y_i with i >= j (i > j when
// exclusive), so dX_j sums dY over those i: CumSum(dY) with `reverse` flipped, `exclusive` kept.
void cumsum_grad(GradCtx& g) {
  Attributes a = g.attrs();
  a.set("reverse", int64_t{a.get_int("reverse", 0) == 0});
  g.set_grad(0, g.op("CumSum", {g.grad_out(0), g.in(1)}, std::move(a), DType::kUndefined, g.info(g.in(0)).shape));
}

// Pad in constant mode: dX = dY's unpadded region = Pad(dY, −pads) (negative pads crop; a crop's
// gradient pads with zeros). The other modes fold the border back onto X: no rule, so the ATen
// fallback runs such a Pad.
void pad_grad(GradCtx& g) {
  const std::string mode = g.attrs().get_string("mode", "constant");
  if (mode != "constant")
    throw GradientError(g.node().describe() + ": no gradient rule for Pad in mode '" + mode + "'");
  const Shape& x = g.info(g.in(0)).shape;
  if (!g.has_in(1)) {  // before opset 11: the pads attribute
    std::vector<int64_t> pads = g.attrs().get_ints("pads", {});
    for (int64_t& p : pads) p = -p;
    Attributes a;
    a.set("pads", pads);
    return g.set_grad(0, g.op("Pad", {g.grad_out(0)}, std::move(a), DType::kUndefined, x));
  }
  std::vector<ValueId> ins{g.grad_out(0), g.neg(g.in(1))};
  if (g.has_in(3)) ins.insert(ins.end(), {kNoValue, g.in(3)});  // the same axes, zeros padded
  g.set_grad(0, g.op("Pad", std::move(ins), {}, DType::kUndefined, x));
}
void reduce_mean_grad(GradCtx& g) { reduce_grad(g, "ReduceMeanGrad"); }

}  // namespace

REGISTER_GRADIENT("Reshape", reshape_like_input_grad, {1});
REGISTER_GRADIENT("Flatten", reshape_like_input_grad, {});
REGISTER_GRADIENT("Squeeze", reshape_like_input_grad, {1});
REGISTER_GRADIENT("Unsqueeze", reshape_like_input_grad, {1});
REGISTER_GRADIENT("Transpose", transpose_grad, {});
REGISTER_GRADIENT("Expand", expand_grad, {1});
REGISTER_GRADIENT("ReduceSum", reduce_sum_grad, {1});
REGISTER_GRADIENT("CumSum", cumsum_grad, {1});  // axis
REGISTER_GRADIENT("ReduceMean", reduce_mean_grad, {1});
REGISTER_GRADIENT("Pad", pad_grad, {1, 2, 3});  // pads, constant_value, axes

// Outputs that are sizes, booleans or constants: no gradient flows through them.
NO_GRADIENT("Shape", "returns sizes, not values");
NO_GRADIENT("Size", "returns a size, not values");
NO_GRADIENT("Constant", "has no inputs");
NO_GRADIENT("ConstantOfShape", "its input is a shape");
NO_GRADIENT("Equal", "boolean output");
NO_GRADIENT("Greater", "boolean output");
NO_GRADIENT("Less", "boolean output");
NO_GRADIENT("Not", "boolean output");

}  // namespace torch_ort
