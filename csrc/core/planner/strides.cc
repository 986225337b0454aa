// Symbolic strides (see strides.h).
#include "csrc/core/planner/strides.h"

#include <utility>

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

namespace {
// a >= b for every size >= 1: a - b is a polynomial with non-negative non-constant coefficients
// that is >= 0 when every size is 1.
bool provably_ge(const SymExpr& a, const SymExpr& b) {
  const SymExpr d = a - b;
  int64_t at_one = 0;
  for (const auto& [factors, c] : d.terms) {
    if (!factors.empty() && c < 0) return false;
    at_one += c;
  }
  return at_one >= 0;
}
}  // namespace

std::optional<SymSizes> dense_like(const SymSizes& sizes, const SymSizes& strides) {
  // Dims outermost first (strides descending); insertion sort as ATen's, size-1 dims stay put.
  std::vector<size_t> order(sizes.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  for (size_t i = 1; i < order.size(); ++i)
    for (size_t j = i; j > 0; --j) {
      const size_t a = order[j - 1], b = order[j];
      if (is_one(sizes[a]) || is_one(sizes[b])) break;
      const bool ge = provably_ge(strides[a], strides[b]), le = provably_ge(strides[b], strides[a]);
      if (!ge && !le) return std::nullopt;  // order unknown
      if (ge) break;
      std::swap(order[j - 1], order[j]);
    }
  SymSizes out(sizes.size());
  SymExpr acc = SymExpr::constant(1);
  for (size_t i = order.size(); i-- > 0;) {
    out[order[i]] = acc;
    acc = acc * sizes[order[i]];
  }
  return out;
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
