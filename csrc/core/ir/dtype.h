// Element types of IR values. Numbering follows ONNX TensorProto.DataType so that import/export
// is a cast, and so that the runtime can map it to ATen scalar types in one table.
#pragma once

#include <cstdint>
#include <string_view>

namespace torch_ort {

enum class DType : int32_t {
  kUndefined = 0,
  kFloat = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kUInt16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kDouble = 11,
  kUInt32 = 12,
  kUInt64 = 13,
  kComplex64 = 14,
  kComplex128 = 15,
  kBFloat16 = 16,
};

std::string_view dtype_name(DType t);
bool is_floating(DType t);  // float16/bfloat16/float/double: the types gradients flow through
int64_t dtype_size(DType t);  // bytes per element; 0 for string/undefined
bool is_valid_dtype(int32_t code);  // an element type we know: 1..16 (0 = undefined is not)

}  // namespace torch_ort
