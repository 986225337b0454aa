// Shape rules of contractions and sliding windows: MatMul, Gemm, Conv, ConvTranspose, pooling.
//
// Window sizes on symbolic dims stay symbolic where they are a cheap expression of the input
// size (stride 1: "h-2"; otherwise the floor-division atom "((h-3)//2)+1"), so they check at
// run time like any other derived dim.
#include "csrc/core/ir/limits.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort {
namespace {

// Fails on two different known contraction sizes; a symbol may stand for anything.
void check_inner(const ShapeCtx& c, const Dim& k1, const Dim& k2, const Shape& a, const Shape& b) {
  if (k1.is_known() && k2.is_known() && k1.value != k2.value)
    c.fail("inner dimensions differ: " + a.to_string() + " · " + b.to_string());
}

// Numpy matmul: (..., M, K)·(..., K, N) -> (broadcast ..., M, N); a rank-1 operand is a row
// (first) or a column (second) whose dim the product drops.
void matmul_shape(ShapeCtx& c) {
  const Shape a = c.in(0), b = c.in(1);
  if (!a.rank_known || !b.rank_known || a.rank() < 1 || b.rank() < 1) return;
  const Dim& ka = a.dims.back();
  const Dim& kb = b.rank() == 1 ? b.dims[0] : b.dims[b.dims.size() - 2];
  check_inner(c, ka, kb, a, b);
  if (a.rank() == 1 && b.rank() == 1) return c.set(0, Shape::of({}));
  if (a.rank() == 1) {  // (K)·(..., K, N) -> (..., N)
    std::vector<Dim> out(b.dims.begin(), b.dims.end() - 2);
    out.push_back(b.dims.back());
    return c.set(0, Shape::of(std::move(out)));
  }
  if (b.rank() == 1) return c.set(0, Shape::of({a.dims.begin(), a.dims.end() - 1}));  // (..., M)
  Shape out = broadcast(c, Shape::of({a.dims.begin(), a.dims.end() - 2}),
                        Shape::of({b.dims.begin(), b.dims.end() - 2}));
  out.dims.push_back(a.dims[a.dims.size() - 2]);
  out.dims.push_back(b.dims.back());
  c.set(0, std::move(out));
}

// Gemm: A' (M, K) · B' (K, N) + C -> (M, N), with A' = transA ? Aᵀ : A (and B' likewise).
void gemm_shape(ShapeCtx& c) {
  const Shape a = c.in(0), b = c.in(1);
  if (a.rank() != 2 || b.rank() != 2) return;
  const bool ta = c.attrs().get_int("transA", 0) != 0, tb = c.attrs().get_int("transB", 0) != 0;
  check_inner(c, a.dims[ta ? 0 : 1], b.dims[tb ? 1 : 0], a, b);
  c.set(0, Shape::of({a.dims[ta ? 1 : 0], b.dims[tb ? 0 : 1]}));
}

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

}  // namespace

REGISTER_SHAPE_RULE("MatMul", matmul_shape);
REGISTER_SHAPE_RULE("Gemm", gemm_shape);
REGISTER_SHAPE_RULE("Conv", conv_shape);
REGISTER_SHAPE_RULE("ConvTranspose", conv_transpose_shape);
REGISTER_SHAPE_RULE("MaxPool", pool_shape);
REGISTER_SHAPE_RULE("AveragePool", pool_shape);
REGISTER_SHAPE_RULE("LpPool", pool_shape);
REGISTER_SHAPE_RULE("GlobalAveragePool", global_pool_shape);
REGISTER_SHAPE_RULE("GlobalMaxPool", global_pool_shape);
REGISTER_SHAPE_RULE("GlobalLpPool", global_pool_shape);

}  // namespace torch_ort
