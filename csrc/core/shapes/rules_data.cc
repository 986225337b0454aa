// Shape rules of ops that make or pick data: Shape/Size, Constant(OfShape), Range, Concat, Slice.
//
// Shape and Size also carry *values* (the input's dims), so the exporter's
// Shape -> Gather/Slice -> Concat -> Reshape chains resolve to symbolic targets.
#include <algorithm>
#include <climits>

#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort {
namespace {

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

}  // namespace

REGISTER_SHAPE_RULE("Shape", shape_shape);
REGISTER_SHAPE_RULE("Size", size_shape);
REGISTER_SHAPE_RULE("Constant", constant_shape);
REGISTER_SHAPE_RULE("ConstantOfShape", constant_of_shape_shape);
REGISTER_SHAPE_RULE("Range", range_shape);
REGISTER_SHAPE_RULE("Concat", concat_shape);
REGISTER_SHAPE_RULE("Slice", slice_shape);

}  // namespace torch_ort
