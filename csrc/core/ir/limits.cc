// Shape checks against the limits of limits.h (element counts without overflow).
#include "csrc/core/ir/limits.h"

#include "csrc/core/ir/shape.h"

namespace torch_ort::limits {

std::optional<int64_t> bounded_numel(const std::vector<int64_t>& dims, std::string* why) {
  if (static_cast<int64_t>(dims.size()) > kMaxRank) {
    *why = "rank " + over(static_cast<int64_t>(dims.size()), "kMaxRank", kMaxRank);
    return std::nullopt;
  }
  bool zero = false;
  for (int64_t d : dims) {
    if (d < 0) {
      *why = "negative dimension " + std::to_string(d);
      return std::nullopt;
    }
    if (d > kMaxDim) {
      *why = "dimension " + over(d, "kMaxDim", kMaxDim);
      return std::nullopt;
    }
    zero = zero || d == 0;
  }
  if (zero) return 0;  // empty, whatever the order of the dims
  int64_t n = 1;
  bool too_many = false;
  for (int64_t d : dims)  // each <= 2^48, the product may still not fit: checked
    if (__builtin_mul_overflow(n, d, &n) || n > kMaxElements) {
      too_many = true;
      break;
    }
  if (too_many) {
    // The exact product may not fit in int64: spell it as the factors. (Appends, not "a" + b:
    // GCC 12 warns falsely, -Wrestrict.)
    std::string text;
    for (int64_t d : dims) {
      if (!text.empty()) text.push_back('x');
      text.append(std::to_string(d));
    }
    *why = "element count " + text + " is over the limit kMaxElements = " +
           std::to_string(kMaxElements) + " (see 'Limits on model input' in docs/hardening.md)";
    return std::nullopt;
  }
  return n;
}

std::string check_shape(const Shape& s) {
  if (!s.rank_known) return {};
  std::vector<int64_t> known;
  for (const auto& d : s.dims)
    if (d.is_known()) known.push_back(d.value);
  if (static_cast<int64_t>(s.dims.size()) > kMaxRank)
    return "rank " + over(static_cast<int64_t>(s.dims.size()), "kMaxRank", kMaxRank);
  std::string why;
  if (!bounded_numel(known, &why)) return why;
  return {};
}

}  // namespace torch_ort::limits
