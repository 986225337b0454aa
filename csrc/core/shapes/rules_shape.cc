// Shape rules of layout ops: Reshape, Flatten, Transpose, Squeeze/Unsqueeze, Expand, Tile, Pad.
#include <algorithm>

#include "csrc/core/ir/limits.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort {
namespace {

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

}  // namespace

REGISTER_SHAPE_RULE("Reshape", reshape_shape);
REGISTER_SHAPE_RULE("Flatten", flatten_shape);
REGISTER_SHAPE_RULE("Transpose", transpose_shape);
REGISTER_SHAPE_RULE("Squeeze", squeeze_shape);
REGISTER_SHAPE_RULE("Unsqueeze", unsqueeze_shape);
REGISTER_SHAPE_RULE("Expand", expand_shape);
REGISTER_SHAPE_RULE("Tile", tile_shape);
REGISTER_SHAPE_RULE("Pad", pad_shape);

}  // namespace torch_ort
