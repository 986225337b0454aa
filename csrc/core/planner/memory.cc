// Static memory estimate of a plan (see memory.h).
#include "csrc/core/planner/memory.h"

namespace torch_ort {

bool value_bytes(const Graph& g, ValueId v, SymExpr* out) {
  const Value& val = g.value(v);
  if (!val.shape.rank_known) return false;
  SymExpr bytes = SymExpr::constant(dtype_size(val.dtype));
  for (const Dim& d : val.shape.dims) {
    auto e = SymExpr::of(d);
    if (!e) return false;
    bytes = bytes * *e;
  }
  *out = bytes;
  return true;
}

}  // namespace torch_ort
