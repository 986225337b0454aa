// Symbolic strides: ATen's layout rules (is_contiguous, and whether at::reshape can view) over
// sizes that are SymExpr products, so that views are decided before any size is known.
// Equality is provable equality of the canonical polynomials; what cannot be proven is treated
// as different, which makes a reshape a copy (the side of counting more bytes).
#pragma once

#include <optional>
#include <vector>

#include "csrc/core/ir/graph.h"
#include "csrc/core/shapes/sym_dim.h"

namespace torch_ort {

using SymSizes = std::vector<SymExpr>;  // sizes or strides (in elements), one per dim

bool same_expr(const SymExpr& a, const SymExpr& b);  // provably equal
bool is_one(const SymExpr& e);
// The value's dims as expressions; nullopt when the rank or a dim is unknown.
std::optional<SymSizes> sizes_of(const Graph& g, ValueId v);
SymSizes row_major(const SymSizes& sizes);  // the strides of a fresh contiguous tensor
// at::Tensor::is_contiguous: row-major, size-1 dims may have any stride.
bool is_row_major(const SymSizes& strides, const SymSizes& sizes);
// The strides at::empty_like (preserve_format) gives a tensor of these sizes and strides: dense,
// its dims in the same stride order; nullopt when that order is not provable.
std::optional<SymSizes> dense_like(const SymSizes& sizes, const SymSizes& strides);
// ATen's computeStride: the strides of a view with `shape` over (old_sizes, old_strides), or
// nullopt when at::reshape would copy (or when that is not provable).
std::optional<SymSizes> view_strides(const SymSizes& old_sizes, const SymSizes& old_strides,
                                  const SymSizes& shape);

}  // namespace torch_ort
