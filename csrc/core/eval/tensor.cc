// Encoding and decoding of the evaluator's tensors (eval/tensor.h).
#include "csrc/core/eval/tensor.h"

#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "csrc/core/ir/limits.h"

namespace torch_ort::eval {

int64_t Tensor::numel() const {
  return integral() ? static_cast<int64_t>(ints.size()) : static_cast<int64_t>(reals.size());
}

int64_t numel_of(const Dims& dims) {
  int64_t n = 1;
  for (int64_t d : dims)
    if (d < 0 || d > limits::kMaxDim || __builtin_mul_overflow(n, d, &n))
      return std::numeric_limits<int64_t>::max();
  return n;
}

Tensor from_data(const TensorData& t) {
  const int64_t size = dtype_size(t.dtype), n = numel_of(t.dims);
  if (size == 0 || n == std::numeric_limits<int64_t>::max() || static_cast<int64_t>(t.raw.size()) != size * n)
    throw std::runtime_error("eval: bad tensor data of dtype " + std::string(dtype_name(t.dtype)));
  Tensor r{t.dtype, t.dims, {}, {}};
  if (is_floating(t.dtype)) {
    r.reals = t.as_doubles();
    return r;
  }
  r.ints.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const char* p = t.raw.data() + i * size;
    auto read = [p](auto v) { std::memcpy(&v, p, sizeof v); return static_cast<int64_t>(v); };
    switch (t.dtype) {
      case DType::kInt64: r.ints.push_back(read(int64_t{})); break;
      case DType::kInt32: r.ints.push_back(read(int32_t{})); break;
      case DType::kInt8: r.ints.push_back(read(int8_t{})); break;
      case DType::kUInt8: r.ints.push_back(read(uint8_t{})); break;
      case DType::kBool: r.ints.push_back(read(uint8_t{}) != 0); break;
      default: throw std::runtime_error("eval: unsupported tensor dtype " + std::string(dtype_name(t.dtype)));
    }
  }
  return r;
}

TensorData to_data(const Tensor& c) {
  TensorData t;
  t.dtype = c.dtype;
  t.dims = c.shape;
  auto put = [&t](const auto& x) { t.raw.append(reinterpret_cast<const char*>(&x), sizeof(x)); };
  for (int64_t i = 0; i < c.numel(); ++i) {
    switch (c.dtype) {
      case DType::kInt64: put(c.ints[i]); break;
      case DType::kInt32: put(static_cast<int32_t>(c.ints[i])); break;
      case DType::kBool: put(static_cast<uint8_t>(c.ints[i] != 0)); break;
      case DType::kFloat: put(static_cast<float>(c.reals[i])); break;
      case DType::kDouble: put(c.reals[i]); break;
      case DType::kFloat16: case DType::kBFloat16:
        t.raw += TensorData::scalar_float(c.dtype, c.reals[i]).raw;
        break;
      default: throw std::runtime_error("eval: cannot encode dtype " + std::string(dtype_name(c.dtype)));
    }
  }
  return t;
}

double round_to_dtype(DType t, double v) {
  if (!is_floating(t) || t == DType::kDouble) return v;
  if (t == DType::kFloat) return static_cast<double>(static_cast<float>(v));
  return TensorData::scalar_float(t, v).as_doubles()[0];  // float16 / bfloat16
}

}  // namespace torch_ort::eval
