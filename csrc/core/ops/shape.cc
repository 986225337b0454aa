// The shape family: ops that move or pick elements (Reshape, Flatten, Transpose, (Un)Squeeze,
// Expand, Tile, Pad, Slice, Split, Concat), make sizes and constants (Shape, Size, Constant,
// ConstantOfShape, Range), and our gradients of them. Kernels: csrc/runtime/kernels/shape*.cc.
// One home per op: its traits line (shape_ops() below), its shape rule (shapes/shape_rules.h) and
// its gradient rule or the reason it has none (autodiff/gradient_registry.h) are all here.
//
// Shape and Size also carry *values* (the input's dims), so the exporter's
// Shape -> Gather/Slice -> Concat -> Reshape chains resolve to symbolic targets.
#include <algorithm>
#include <climits>

#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/limits.h"
#include "csrc/core/ops/families.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort::ops {
namespace {

DType constant_dtype(const Graph&, const Node& n, size_t) {
  if (const TensorData* t = n.attrs.get_tensor("value")) return t->dtype;
  if (n.attrs.has("value_float") || n.attrs.has("value_floats")) return DType::kFloat;
  if (n.attrs.has("value_int") || n.attrs.has("value_ints")) return DType::kInt64;
  return DType::kUndefined;
}
DType constant_of_shape_dtype(const Graph&, const Node& n, size_t) {
  const TensorData* t = n.attrs.get_tensor("value");
  return t ? t->dtype : DType::kFloat;
}
// ConcatGrad(dY, shape(X_0), ..., shape(X_n-1)): every input past dY.
void shapes_past_dy(const Node& n, std::vector<int>& out) {
  for (int i = 1; i < static_cast<int>(n.inputs.size()); ++i) out.push_back(i);
}

}  // namespace

std::vector<OpEntry> shape_ops() {
  using enum ViewRule;
  const std::vector<DType> kInt64Out{DType::kInt64};
  return {
      {"", "Concat", {.recomputable = true, .host_computable = true}},
      {"", "Constant", {.output_dtype_of = constant_dtype}},
      {"", "ConstantOfShape",  // host input: shape
       {.recomputable = true, .host_computable = true, .host_inputs = {0}, .output_dtype_of = constant_of_shape_dtype}},
      // host inputs: shape
      {"", "Expand", {.recomputable = true, .host_computable = true, .host_inputs = {1}, .view = kExpand}},
      {"", "Flatten", {.recomputable = true, .host_computable = true, .view = kReshape}},
      {"", "Pad", {.host_inputs = {1, 2, 3}}},  // pads, constant_value, axes
      // host inputs: start, limit, delta
      {"", "Range", {.recomputable = true, .host_computable = true, .host_inputs = {0, 1, 2}}},
      // host inputs: shape
      {"", "Reshape", {.recomputable = true, .host_computable = true, .host_inputs = {1}, .view = kReshape}},
      {"", "Shape", {.reads_metadata_only = true, .output_dtypes = kInt64Out}},
      {"", "Size", {.reads_metadata_only = true, .output_dtypes = kInt64Out}},
      // host inputs: starts, ends, axes, steps
      {"", "Slice",
       {.recomputable = true, .host_computable = true, .host_inputs = {1, 2, 3, 4}, .view = kSlice}},
      // Split: split
      {"", "Split", {.recomputable = true, .host_computable = true, .host_inputs = {1}, .view = kSplit}},
      // host inputs: axes
      {"", "Squeeze", {.recomputable = true, .host_computable = true, .host_inputs = {1}, .view = kSqueeze}},
      {"", "Tile", {.host_computable = true, .host_inputs = {1, 2}}},  // repeats (and opset 1's axis)
      {"", "Transpose", {.recomputable = true, .host_computable = true, .view = kTranspose}},
      // host inputs: axes
      {"", "Unsqueeze",
       {.recomputable = true, .host_computable = true, .host_inputs = {1}, .view = kUnsqueeze}},
      // (dY, shape(X_0), ..., shape(X_n-1)): every input past dY is on the host
      // arity: (dY, shape(X_i)...) -> ([dX_i]...)
      {kOurDomain, "ConcatGrad", {.view = kSplit, .arity = OpArity{2, kVariadic, 1, kVariadic, 0, slots({0})},
                                  .more_host_inputs = shapes_past_dy}},
      // arity: (dY, shape(X), [starts], [ends], [axes], [steps])
      {kOurDomain, "SliceGrad", {.host_inputs = {1, 2, 3, 4, 5}, .arity = OpArity{2, 6, 1, 1}}},  // shape(X), starts, ends, axes, steps
      // arity: (shape(X), [split], [dY_0], [dY_i]...)
      {kOurDomain, "SplitGrad", {.host_inputs = {0, 1}, .arity = OpArity{3, kVariadic, 1, 1, slots({1, 2})}}},  // shape(X), split
      // arity: (dY, shape(X))
      {kOurDomain, "TileGrad", {.host_inputs = {1}, .arity = OpArity{2, 2, 1, 1}}},  // shape(X)
  };
}

}  // namespace torch_ort::ops

namespace torch_ort {
namespace {

// --- shape rules (shapes/shape_rules.h)

// How many of start, start+step, ... lie before `end` (after it for step < 0): max(0,
// ceil((end - start) / step)); nullopt when that does not fit int64 (from hostile constants).
std::optional<int64_t> steps_between(int64_t start, int64_t end, int64_t step) {
  if (step == 0) return std::nullopt;
  int64_t span;  // distance to cover, in the direction of the step
  if (step > 0 ? end <= start : end >= start) return 0;
  if (__builtin_sub_overflow(step > 0 ? end : start, step > 0 ? start : end, &span)) return std::nullopt;
  // ceil(span / |step|) as (span - 1) / |step| + 1: no overflow, and |INT64_MIN| handled.
  if (step == INT64_MIN) return 1;
  return (span - 1) / (step > 0 ? step : -step) + 1;
}

SymValues values_of_dims(const std::vector<Dim>& dims) {
  SymValues out;
  for (const Dim& d : dims) out.push_back(SymExpr::of(d));
  return out;
}

// Shape(X; start, end): X's dims [start, end) as an int64 vector whose values are the dims.
void shape_shape(ShapeCtx& c) {
  const Shape x = c.in(0);
  if (!x.rank_known) return c.set(0, Shape::of({Dim{}}));
  const int64_t r = x.rank();
  auto clamp = [r](int64_t i) { return std::clamp(i < 0 ? i + r : i, int64_t{0}, r); };
  const int64_t b = clamp(c.attrs().get_int("start", 0)), e = clamp(c.attrs().get_int("end", r));
  c.set_values(0, values_of_dims({x.dims.begin() + b, x.dims.begin() + std::max(b, e)}));
}

void size_shape(ShapeCtx& c) {
  const Shape x = c.in(0);
  if (!x.rank_known) return c.set(0, Shape::of({}));
  c.set_values(0, {SymExpr::of(dim_product(x.dims))}, /*scalar=*/true);
}

void constant_shape(ShapeCtx& c) {
  const Attributes& a = c.attrs();
  if (const TensorData* t = a.get_tensor("value")) {
    Shape s = Shape::of({});
    for (int64_t d : t->dims) s.dims.push_back(Dim::known(d));
    if ((t->dtype == DType::kInt64 || t->dtype == DType::kInt32) && t->numel() <= 64) {
      SymValues v;
      for (int64_t x : t->as_int64s()) v.push_back(SymExpr::constant(x));
      c.set_values(0, std::move(v));
    }
    return c.set(0, s);
  }
  if (a.has("value_int")) return c.set_values(0, {SymExpr::constant(a.get_int("value_int", 0))}, true);
  if (a.has("value_ints")) {
    SymValues v;
    for (int64_t x : a.get_ints("value_ints", {})) v.push_back(SymExpr::constant(x));
    return c.set_values(0, std::move(v));
  }
  if (a.has("value_float") || a.has("value_string")) return c.set(0, Shape::of({}));
  if (a.has("value_floats"))
    return c.set(0, Shape::of({Dim::known(int64_t(a.get_floats("value_floats", {}).size()))}));
  if (a.has("value_strings"))
    return c.set(0, Shape::of({Dim::known(int64_t(a.get_strings("value_strings", {}).size()))}));
}

void constant_of_shape_shape(ShapeCtx& c) { c.set(0, shape_from_values(c, 0)); }

// Range(start, limit, delta) -> (max(0, ceil((limit − start) / delta))). With delta 1 the length
// stays symbolic: limit − start (assumed non-negative).
void range_shape(ShapeCtx& c) {
  const SymValues *s = c.values(0), *l = c.values(1), *d = c.values(2);
  const auto one = [](const SymValues* v) { return v && v->size() == 1 && (*v)[0]; };
  if (!one(s) || !one(l) || !one(d)) return c.set(0, Shape::of({Dim{}}));
  const SymExpr &start = *(*s)[0], &limit = *(*l)[0], &delta = *(*d)[0];
  if (start.is_constant() && limit.is_constant() && delta.is_constant() && delta.constant_value() != 0) {
    const int64_t a = start.constant_value(), b = limit.constant_value(), st = delta.constant_value();
    const std::optional<int64_t> count = steps_between(a, b, st);
    if (!count) return c.set(0, Shape::of({Dim{}}));  // the length overflows int64: unknown
    const int64_t n = *count;
    if (n > 64 || c.dtype(0) == DType::kFloat || c.dtype(0) == DType::kDouble)
      return c.set(0, Shape::of({Dim::known(n)}));
    SymValues v;
    for (int64_t k = 0; k < n; ++k) v.push_back(SymExpr::constant(a + k * st));
    return c.set_values(0, std::move(v));
  }
  const bool unit = delta.is_constant() && delta.constant_value() == 1;
  c.set(0, Shape::of({unit ? (limit - start).to_dim() : Dim{}}));
}

// Concat(axis): dims along `axis` add up; the others must agree.
void concat_shape(ShapeCtx& c) {
  const int64_t axis_attr = c.attrs().get_int("axis", 0);
  Shape out;
  SymValues values;
  bool all_values = true, some_rank_unknown = false;
  for (int i = 0; i < c.num_inputs(); ++i) {
    if (!c.has_in(i)) continue;
    const Shape s = c.in(i);
    const SymValues* v = c.values(i);
    all_values = all_values && v && s.rank() == 1;
    if (all_values) values.insert(values.end(), v->begin(), v->end());
    if (!s.rank_known) { some_rank_unknown = true; continue; }
    if (!out.rank_known) { out = s; continue; }
    if (s.rank() != out.rank())
      c.fail("inputs of rank " + std::to_string(out.rank()) + " and " + std::to_string(s.rank()));
    const int64_t axis = norm_axis(c, axis_attr, s.rank());
    for (int64_t d = 0; d < s.rank(); ++d) {
      Dim& o = out.dims[d];
      const Dim& n = s.dims[d];
      if (d == axis) o = dim_add(o, n);
      else if (o.is_known() && n.is_known() && o.value != n.value)
        c.fail("inputs disagree on dim " + std::to_string(d) + " (" + std::to_string(o.value) + " vs " +
               std::to_string(n.value) + ")");
      else if (!o.is_known() && (n.is_known() || !o.is_symbolic())) o = n;
    }
  }
  if (all_values && out.rank() == 1) return c.set_values(0, std::move(values));
  if (some_rank_unknown && out.rank_known) out.dims[norm_axis(c, axis_attr, out.rank())] = Dim{};
  c.set(0, out);
}

// Elements [start, end) step `step` of a dim of size `d`, ONNX clamping. Symbolic d: step 1
// only, as an expression of d (assumes d is at least the constant offsets).
Dim slice_len(const Dim& d, int64_t start, int64_t end, int64_t step) {
  if (step == 0) return Dim{};
  if (d.is_known()) {
    const int64_t n = d.value;
    if (n == 0) return Dim::known(0);  // (and the clamps below need n - 1 >= 0)
    auto norm = [&](int64_t i, int64_t lo, int64_t hi) { return std::clamp(i < 0 ? i + n : i, lo, hi); };
    // start/end clamp into [-1, n] (n <= kMaxDim); i + n cannot overflow for i < 0.
    const int64_t s = step > 0 ? norm(start, 0, n) : norm(start, 0, n - 1);
    const int64_t e = step > 0 ? norm(end, 0, n) : norm(end, -1, n - 1);
    const std::optional<int64_t> len = steps_between(s, e, step);
    return len ? Dim::known(*len) : Dim{};
  }
  const SymInt x = SymExpr::of(d);
  if (!x || step != 1) return Dim{};
  const bool to_end = end >= INT32_MAX;
  if (start >= 0 && !to_end && end >= 0) return Dim{};  // a constant length only if d >= end
  const SymExpr s = start < 0 ? *x + SymExpr::constant(start) : SymExpr::constant(start);
  const SymExpr e = to_end ? *x : end < 0 ? *x + SymExpr::constant(end) : SymExpr::constant(end);
  return (e - s).to_dim();
}

// Slice(data, starts, ends, axes?, steps?) (attributes before opset 10).
void slice_shape(ShapeCtx& c) {
  Shape x = c.in(0);
  if (!x.rank_known) return;
  const bool attrs = c.opset() < 10;
  auto get = [&](int i, const char* name) -> std::optional<std::vector<int64_t>> {
    if (attrs) return c.attrs().has(name) ? std::optional(c.attrs().get_ints(name, {})) : std::nullopt;
    return c.has_in(i) ? c.ints(i) : std::nullopt;
  };
  const auto starts = get(1, "starts"), ends = get(2, "ends");
  auto axes = get(3, "axes");
  auto steps = get(4, "steps");
  const bool axes_given = attrs ? c.attrs().has("axes") : c.has_in(3);
  if (!axes && axes_given) return c.set(0, unknown_dims(x.rank()));
  if (!starts || !ends || starts->size() != ends->size()) {
    if (!axes) return c.set(0, unknown_dims(x.rank()));
    for (int64_t a : *axes) x.dims[norm_axis(c, a, x.rank())] = Dim{};
    return c.set(0, x);
  }
  if (!axes) { axes.emplace(); for (size_t k = 0; k < starts->size(); ++k) axes->push_back(int64_t(k)); }
  if (!steps) steps = std::vector<int64_t>(starts->size(), 1);
  if (axes->size() != starts->size() || steps->size() != starts->size())
    return c.set(0, unknown_dims(x.rank()));
  const SymValues* v = c.values(0);
  for (size_t k = 0; k < axes->size(); ++k) {
    const int64_t a = norm_axis(c, (*axes)[k], x.rank());
    x.dims[a] = slice_len(x.dims[a], (*starts)[k], (*ends)[k], (*steps)[k]);
  }
  // Slicing a (non-empty: the clamps need n - 1 >= 0) shape vector.
  if (v && !v->empty() && x.rank() == 1 && axes->size() == 1 && (*steps)[0] != 0) {
    const int64_t n = static_cast<int64_t>(v->size()), st = (*steps)[0];
    auto norm = [&](int64_t i, int64_t lo, int64_t hi) { return std::clamp(i < 0 ? i + n : i, lo, hi); };
    SymValues out;
    const int64_t i = st > 0 ? norm((*starts)[0], 0, n) : norm((*starts)[0], 0, n - 1);
    const int64_t e = st > 0 ? norm((*ends)[0], 0, n) : norm((*ends)[0], -1, n - 1);
    // Counted, not stepped: i += st could overflow for a step near INT64_MAX.
    const int64_t count = steps_between(i, e, st).value_or(0);
    for (int64_t k = 0; k < count; ++k) out.push_back((*v)[i + k * st]);
    return c.set_values(0, std::move(out));
  }
  c.set(0, x);
}

// Values of a small int tensor pass through layout ops unchanged when the result is 0-D or 1-D
// (Reshape(scalar, [-1]), Squeeze([1]) and friends in the exporter's shape arithmetic).
void pass_values(ShapeCtx& c, const Shape& out) {
  const SymValues* v = c.values(0);
  if (v && out.rank_known && out.rank() <= 1) c.set_values(0, *v, out.rank() == 0);
  c.set(0, out);
}

// Reshape(data, shape; allowzero): -1 takes the remaining elements (total / the other dims, kept
// symbolic: [batch, seq, 768] -> [-1, 768] gives [batch*seq, 768]); 0 copies the input dim
// unless allowzero.
void reshape_shape(ShapeCtx& c) {
  const Shape x = c.in(0);
  const SymValues* target = c.values(1);
  if (!target) return c.set(0, shape_from_values(c, 1));
  const bool allowzero = c.attrs().get_int("allowzero", 0) != 0;
  Shape out = Shape::of({});
  int64_t infer_at = -1;
  for (size_t k = 0; k < target->size(); ++k) {
    const SymInt& e = (*target)[k];
    if (!e || !e->is_constant()) { out.dims.push_back(e ? e->to_dim() : Dim{}); continue; }
    const int64_t v = e->constant_value();
    if (v == -1) {
      if (infer_at >= 0) c.fail("the target shape has two -1 entries");
      infer_at = static_cast<int64_t>(k);
      out.dims.push_back(Dim{});
    } else if (v == 0 && !allowzero) {
      out.dims.push_back(x.rank_known && static_cast<int64_t>(k) < x.rank() ? x.dims[k] : Dim{});
    } else if (v >= 0) {
      out.dims.push_back(Dim::known(v));
    } else {
      c.fail("the target shape holds " + std::to_string(v));
    }
  }
  if (x.rank_known) {
    std::vector<Dim> others = out.dims;
    if (infer_at >= 0) others.erase(others.begin() + infer_at);
    const Dim total = dim_product(x.dims), rest = dim_product(others);
    const bool fits = !total.is_known() || !rest.is_known() ||
                      (infer_at >= 0 ? rest.value == 0 || total.value % rest.value == 0
                                     : total.value == rest.value);
    if (!fits)
      c.fail("cannot reshape " + x.to_string() + " (" + std::to_string(total.value) +
             " elements) to " + out.to_string());
    if (infer_at >= 0) out.dims[infer_at] = dim_div_exact(total, rest);
  }
  pass_values(c, out);
}

// Flatten(axis = 1): (d0..dn) -> (d0·…·d(axis−1), d(axis)·…·dn).
void flatten_shape(ShapeCtx& c) {
  const Shape x = c.in(0);
  if (!x.rank_known) return c.set(0, unknown_dims(2));
  int64_t axis = c.attrs().get_int("axis", 1);
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis > x.rank()) c.fail("axis " + std::to_string(axis) + " is out of range");
  c.set(0, Shape::of({dim_product({x.dims.begin(), x.dims.begin() + axis}),
                      dim_product({x.dims.begin() + axis, x.dims.end()})}));
}

void transpose_shape(ShapeCtx& c) {
  const Shape x = c.in(0);
  if (!x.rank_known) return;
  std::vector<int64_t> perm = c.attrs().get_ints("perm", {});
  if (perm.empty())
    for (int64_t i = x.rank() - 1; i >= 0; --i) perm.push_back(i);
  if (static_cast<int64_t>(perm.size()) != x.rank())
    c.fail("perm has " + std::to_string(perm.size()) + " entries for an input of rank " +
           std::to_string(x.rank()));
  Shape out = Shape::of({});
  std::vector<bool> seen(perm.size(), false);
  for (int64_t p : perm) {
    const int64_t axis = norm_axis(c, p, x.rank());
    if (seen[static_cast<size_t>(axis)]) c.fail("perm names axis " + std::to_string(axis) + " twice");
    seen[static_cast<size_t>(axis)] = true;
    out.dims.push_back(x.dims[static_cast<size_t>(axis)]);
  }
  c.set(0, out);
}

// Axes of Squeeze/Unsqueeze: input 1 since opset 13, the 'axes' attribute before.
std::optional<std::vector<int64_t>> axes_of(const ShapeCtx& c) {
  if (c.has_in(1)) return c.ints(1);
  if (c.attrs().has("axes")) return c.attrs().get_ints("axes", {});
  return std::vector<int64_t>{};
}

void squeeze_shape(ShapeCtx& c) {
  const Shape x = c.in(0);
  const auto axes = axes_of(c);
  if (!x.rank_known || !axes) return;
  std::vector<bool> drop(x.dims.size(), false);
  for (int64_t a : *axes) {
    const int64_t d = norm_axis(c, a, x.rank());
    // ONNX rejects squeezing a size > 1; ATen keeps the dim. Claim neither.
    if (x.dims[d].is_known() && x.dims[d].value != 1) return;
    drop[d] = true;
  }
  Shape out = Shape::of({});
  for (size_t d = 0; d < x.dims.size(); ++d) {
    const bool one = x.dims[d].is_known() && x.dims[d].value == 1;
    if (axes->empty() && !x.dims[d].is_known()) return;  // "all size-1 dims": which ones?
    if (axes->empty() ? !one : !drop[d]) out.dims.push_back(x.dims[d]);
  }
  pass_values(c, out);
}

void unsqueeze_shape(ShapeCtx& c) {
  const Shape x = c.in(0);
  const auto axes = axes_of(c);
  if (!x.rank_known || !axes) return;
  const int64_t rank = x.rank() + static_cast<int64_t>(axes->size());
  std::vector<bool> inserted(rank, false);
  for (int64_t a : *axes) inserted[norm_axis(c, a, rank)] = true;
  Shape out = Shape::of({});
  size_t next = 0;
  for (int64_t d = 0; d < rank; ++d)
    out.dims.push_back(inserted[d] ? Dim::known(1) : next < x.dims.size() ? x.dims[next++] : Dim{});
  pass_values(c, out);
}

// Expand(X, shape): numpy broadcasting of X against the target shape.
void expand_shape(ShapeCtx& c) { c.set(0, broadcast(c, c.in(0), shape_from_values(c, 1))); }

// Tile(X, repeats): dim · repeat.
void tile_shape(ShapeCtx& c) {
  Shape x = c.in(0);
  const SymValues* reps = c.values(1);
  if (!x.rank_known) return;
  for (size_t d = 0; d < x.dims.size(); ++d)
    x.dims[d] =
        reps && d < reps->size() && (*reps)[d] ? dim_mul(x.dims[d], (*reps)[d]->to_dim()) : Dim{};
  c.set(0, x);
}

// Pad(X, pads, value?, axes?): dim + pad_begin + pad_end ('pads' attribute before opset 11).
void pad_shape(ShapeCtx& c) {
  Shape x = c.in(0);
  if (!x.rank_known) return;
  std::optional<std::vector<int64_t>> pads =
      c.has_in(1) ? c.ints(1) : std::optional(c.attrs().get_ints("pads", {}));
  std::vector<int64_t> axes(x.dims.size());
  for (size_t d = 0; d < axes.size(); ++d) axes[d] = static_cast<int64_t>(d);
  if (c.has_in(3)) {
    auto a = c.ints(3);
    if (!a) return c.set(0, unknown_dims(x.rank()));
    axes = *a;
  }
  if (!pads || pads->size() != 2 * axes.size()) return c.set(0, unknown_dims(x.rank()));
  for (size_t k = 0; k < axes.size(); ++k) {
    const int64_t d = norm_axis(c, axes[k], x.rank());
    const SymInt e = SymExpr::of(x.dims[d]);
    // checked_add / SymExpr throw on overflow: run_shape_rule makes the output unknown.
    x.dims[d] = e ? (*e + SymExpr::constant(checked_add((*pads)[k], (*pads)[k + axes.size()]))).to_dim()
                  : Dim{};
  }
  c.set(0, x);
}

// Split(X, split?; axis, num_outputs): sizes from input 1 (opset >= 13) or the 'split'
// attribute; without them an equal split over the outputs (opset 18: the last chunk may be
// smaller, ceil-sized chunks first).
void split_shape(ShapeCtx& c) {
  const Shape x = c.in(0);
  if (!x.rank_known) return;
  const int64_t axis = norm_axis(c, c.attrs().get_int("axis", 0), x.rank());
  const int n = c.num_outputs();
  std::vector<Dim> sizes(n);
  const SymValues* given = c.values(1);
  const auto attr = c.attrs().get_ints("split", {});
  if (given && static_cast<int>(given->size()) == n) {
    for (int k = 0; k < n; ++k) sizes[k] = (*given)[k] ? (*given)[k]->to_dim() : Dim{};
  } else if (c.has_in(1)) {
    // sizes known only at run time: unknown along the axis
  } else if (static_cast<int>(attr.size()) == n) {
    for (int k = 0; k < n; ++k) sizes[k] = Dim::known(attr[k]);
  } else if (x.dims[axis].is_known()) {
    const int64_t d = x.dims[axis].value, chunk = (d + n - 1) / n;
    for (int k = 0; k < n; ++k) sizes[k] = Dim::known(k + 1 < n ? chunk : d - chunk * (n - 1));
  } else {
    for (int k = 0; k < n; ++k) sizes[k] = dim_div_exact(x.dims[axis], Dim::known(n));
  }
  for (int k = 0; k < n; ++k) {
    Shape out = x;
    out.dims[axis] = sizes[k];
    c.set(k, out);
  }
}


// --- gradient rules (autodiff/gradient_registry.h)

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

// dX = zeros(shape(X)) with dY written into the sliced region. starts/ends/axes/steps are passed
// through as they are (constants or run-time values); opset < 10 carries them as attributes.
void slice_grad(GradCtx& g) {
  std::vector<ValueId> ins{g.grad_out(0), g.shape_of(g.in(0))};
  for (int i = 1; i < static_cast<int>(g.node().inputs.size()); ++i)
    ins.push_back(g.has_in(i) ? g.in(i) : kNoValue);
  g.set_grad(0, g.ours("SliceGrad", std::move(ins), g.attrs(), DType::kUndefined, g.info(g.in(0)).shape));
}

// dX_i = dY narrowed to X_i's extent along axis; every input's shape fixes the offsets, but only
// the inputs that need a gradient get an output.
void concat_grad(GradCtx& g) {
  std::vector<ValueId> ins{g.grad_out(0)}, like;
  for (int i = 0; i < static_cast<int>(g.node().inputs.size()); ++i) {
    ins.push_back(g.shape_of(g.in(i)));
    like.push_back(g.needs(i) ? g.in(i) : kNoValue);
  }
  Attributes a;
  a.set("axis", g.attrs().get_int("axis", 0));
  std::vector<ValueId> grads = g.ours_multi("ConcatGrad", std::move(ins), like, std::move(a));
  for (int i = 0; i < static_cast<int>(grads.size()); ++i) g.set_grad(i, grads[i]);
}

// dX = concat(dY_0, ..., dY_n-1) along axis; an output with no incoming gradient contributes
// zeros, sized as the forward split it (same split input / num_outputs / attributes).
void split_grad(GradCtx& g) {
  std::vector<ValueId> ins{g.shape_of(g.in(0)), g.has_in(1) ? g.in(1) : kNoValue};
  for (int i = 0; i < static_cast<int>(g.node().outputs.size()); ++i) ins.push_back(g.grad_out(i));
  ValueId any = kNoValue;
  for (size_t i = 2; i < ins.size() && any == kNoValue; ++i) any = ins[i];
  g.set_grad(0, g.ours("SplitGrad", std::move(ins), g.attrs(), g.info(any).dtype, g.info(g.in(0)).shape));
}

// dX = dY viewed as (r_0, x_0, r_1, x_1, ...) and summed over the repeat axes r_k.
void tile_grad(GradCtx& g) {
  g.set_grad(0, g.ours("TileGrad", {g.grad_out(0), g.shape_of(g.in(0))}, {}, DType::kUndefined,
                       g.info(g.in(0)).shape));
}

}  // namespace

REGISTER_SHAPE_RULE("Shape", shape_shape);
REGISTER_SHAPE_RULE("Size", size_shape);
REGISTER_SHAPE_RULE("Constant", constant_shape);
REGISTER_SHAPE_RULE("ConstantOfShape", constant_of_shape_shape);
REGISTER_SHAPE_RULE("Range", range_shape);
REGISTER_SHAPE_RULE("Concat", concat_shape);
REGISTER_SHAPE_RULE("Slice", slice_shape);
REGISTER_SHAPE_RULE("Reshape", reshape_shape);
REGISTER_SHAPE_RULE("Flatten", flatten_shape);
REGISTER_SHAPE_RULE("Transpose", transpose_shape);
REGISTER_SHAPE_RULE("Squeeze", squeeze_shape);
REGISTER_SHAPE_RULE("Unsqueeze", unsqueeze_shape);
REGISTER_SHAPE_RULE("Expand", expand_shape);
REGISTER_SHAPE_RULE("Tile", tile_shape);
REGISTER_SHAPE_RULE("Pad", pad_shape);
REGISTER_SHAPE_RULE("Split", split_shape);
// Declared by the gradient builder when it emits them: (dY, shape_of(X), ...) or one output per
// forward input.
REGISTER_SHAPE_RULE_IN(kOurDomain, "SliceGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "ConcatGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "SplitGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "TileGrad", declared_by_gradient_builder);

REGISTER_GRADIENT("Reshape", reshape_like_input_grad, {1});
REGISTER_GRADIENT("Flatten", reshape_like_input_grad, {});
REGISTER_GRADIENT("Squeeze", reshape_like_input_grad, {1});
REGISTER_GRADIENT("Unsqueeze", reshape_like_input_grad, {1});
REGISTER_GRADIENT("Transpose", transpose_grad, {});
REGISTER_GRADIENT("Expand", expand_grad, {1});
REGISTER_GRADIENT("Slice", slice_grad, {1, 2, 3, 4});
REGISTER_GRADIENT("Concat", concat_grad, {});
REGISTER_GRADIENT("Split", split_grad, {1});
REGISTER_GRADIENT("Tile", tile_grad, {1});
REGISTER_GRADIENT("Pad", pad_grad, {1, 2, 3});  // pads, constant_value, axes

// Outputs that are sizes, constants or index ranges: no gradient flows through them.
NO_GRADIENT("Shape", "returns sizes, not values");
NO_GRADIENT("Size", "returns a size, not values");
NO_GRADIENT("Constant", "has no inputs");
NO_GRADIENT("ConstantOfShape", "its input is a shape");
NO_GRADIENT("Range", "an arange, not differentiable (as torch.arange)");

}  // namespace torch_ort
