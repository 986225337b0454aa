// Symbolic shape helpers: provable equality and printing for error messages.
#include "csrc/core/ir/shape.h"

namespace torch_ort {

bool Shape::same_as(const Shape& o) const {
  // Unknown rank proves nothing, not even equality with another unknown shape.
  if (!rank_known || !o.rank_known || dims.size() != o.dims.size()) return false;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (!dims[i].same_as(o.dims[i])) return false;
  }
  return true;
}

std::string Shape::to_string() const {
  if (!rank_known) return "[?]";
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ",";
    const Dim& d = dims[i];
    s += d.is_known() ? std::to_string(d.value) : d.is_symbolic() ? d.symbol : std::string("?");
  }
  return s + "]";
}

}  // namespace torch_ort
