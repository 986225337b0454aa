// Shape rules of reductions, ArgMax/ArgMin/TopK, and our ops that undo a reduction or broadcast.
//
// ReduceSumGrad, ReduceMeanGrad and SumToShape take their output shape from the *values* of
// their shape input (a Shape of the forward value, or a constant).
#include <algorithm>

#include "csrc/core/ir/graph.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort {
namespace {

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

REGISTER_SHAPE_RULE_IN(kOurDomain, "ReduceSumGrad", from_shape_input1);   // (dY, shape(X), axes?)
REGISTER_SHAPE_RULE_IN(kOurDomain, "ReduceMeanGrad", from_shape_input1);  // (dY, shape(X), axes?)
REGISTER_SHAPE_RULE_IN(kOurDomain, "SumToShape", from_shape_input1);      // (dY, shape)

}  // namespace torch_ort
