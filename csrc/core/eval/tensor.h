// A small tensor of concrete data for the evaluator (eval/eval.h): integers (int64, int32, bool,
// int8, uint8, ...) kept exactly as int64 -- an int64 position may be INT64_MAX and integer
// arithmetic detects overflow --, floating types as doubles. The evaluator does NOT round a
// floating result to its dtype; a caller that needs the dtype's values rounds (round_to_dtype).
#pragma once

#include <cstdint>
#include <vector>

#include "csrc/core/ir/attribute.h"
#include "csrc/core/ir/dtype.h"

namespace torch_ort::eval {

using Dims = std::vector<int64_t>;

struct Tensor {
  DType dtype = DType::kUndefined;
  Dims shape;                  // {} for a scalar
  std::vector<int64_t> ints;   // integral dtypes (bool as 0/1): numel() entries, row-major
  std::vector<double> reals;   // floating dtypes: numel() entries, row-major

  bool integral() const { return !is_floating(dtype); }
  int64_t numel() const;  // from the stored elements
  double at(int64_t i) const { return integral() ? static_cast<double>(ints[i]) : reals[i]; }
  // Appends element i of x (same integral-ness as this tensor).
  void push(const Tensor& x, int64_t i) {
    if (integral()) ints.push_back(x.ints[i]);
    else reals.push_back(x.reals[i]);
  }
  static Tensor of_ints(DType dtype, Dims shape, std::vector<int64_t> v) { return Tensor{dtype, std::move(shape), std::move(v), {}}; }
  static Tensor of_reals(DType dtype, Dims shape, std::vector<double> v) { return Tensor{dtype, std::move(shape), {}, std::move(v)}; }
};

// Product of dims; saturates at INT64_MAX for a negative dim, a dim over limits::kMaxDim or an
// overflowing product (hostile shapes read from data are then simply too large).
int64_t numel_of(const Dims& dims);

// Decodes a payload (float, double, float16, bfloat16, int64, int32, int8, uint8, bool); throws
// std::runtime_error for other dtypes or a payload of the wrong size.
Tensor from_data(const TensorData& t);
// Encodes a tensor of dtype float, double, float16, bfloat16, int64, int32 or bool (floats are
// rounded to the dtype by the encoding); throws for other dtypes.
TensorData to_data(const Tensor& t);

// The nearest value of a floating dtype to v (identity for double and integral dtypes).
double round_to_dtype(DType t, double v);

}  // namespace torch_ort::eval
