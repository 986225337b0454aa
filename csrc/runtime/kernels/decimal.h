// Float attributes that were Python floats (doubles) before export: ONNX stores attributes as
// float32, so LayerNorm's epsilon 1e-5 arrives as 9.99999974e-06. PyTorch computed with the double,
// so recover it: the shortest decimal that rounds to the same float is what the user wrote
// (1e-5, 0.1) whenever that had at most 9 significant digits, and otherwise the float itself.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace torch_ort::kernels {

inline double shortest_decimal(float f) {
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {  // 9 digits always round-trip a float
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
    const double d = std::strtod(buf, nullptr);
    if (static_cast<float>(d) == f) return d;
  }
  return static_cast<double>(f);
}

}  // namespace torch_ort::kernels
