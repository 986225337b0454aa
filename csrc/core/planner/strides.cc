// Symbolic strides (see strides.h).
#include "csrc/core/planner/strides.h"

namespace torch_ort {

bool same_expr(const SymExpr& a, const SymExpr& b) { return a.terms == b.terms; }
bool is_one(const SymExpr& e) { return e.is_constant() && e.constant_value() == 1; }

std::optional<SymSizes> sizes_of(const Graph& g, ValueId v) {
  const Shape& s = g.value(v).shape;
  if (!s.rank_known) return std::nullopt;
  SymSizes out;
  for (const Dim& d : s.dims) {
    auto e = SymExpr::of(d);
    if (!e) return std::nullopt;
    out.push_back(*e);
  }
  return out;
}

SymSizes row_major(const SymSizes& sizes) {
  SymSizes st(sizes.size());
  SymExpr acc = SymExpr::constant(1);
  for (size_t k = sizes.size(); k-- > 0;) {
    st[k] = acc;
    acc = acc * sizes[k];
  }
  return st;
}

bool is_row_major(const SymSizes& strides, const SymSizes& sizes) {
  SymExpr expected = SymExpr::constant(1);
  for (size_t k = sizes.size(); k-- > 0;) {
    if (is_one(sizes[k])) continue;
    if (!same_expr(strides[k], expected)) return false;
    expected = expected * sizes[k];
  }
  return true;
}

std::optional<SymSizes> view_strides(const SymSizes& old_sizes, const SymSizes& old_strides,
                                  const SymSizes& shape) {
  if (old_sizes.empty()) return row_major(shape);
  SymSizes out(shape.size());
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  SymExpr chunk_base = old_strides.back();
  SymExpr tensor_numel = SymExpr::constant(1), view_numel = SymExpr::constant(1);
  for (int64_t d = static_cast<int64_t>(old_sizes.size()) - 1; d >= 0; --d) {
    tensor_numel = tensor_numel * old_sizes[d];
    if (d > 0 && (is_one(old_sizes[d - 1]) ||
                  same_expr(old_strides[d - 1], tensor_numel * chunk_base)))
      continue;  // the chunk goes on
    while (view_d >= 0 && (!same_expr(view_numel, tensor_numel) || is_one(shape[view_d]))) {
      out[view_d] = view_numel * chunk_base;
      view_numel = view_numel * shape[view_d];
      --view_d;
    }
    if (!same_expr(view_numel, tensor_numel)) return std::nullopt;
    if (d > 0) {
      chunk_base = old_strides[d - 1];
      tensor_numel = view_numel = SymExpr::constant(1);
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

}  // namespace torch_ort
