// Element-type tables: names for error messages, sizes for raw tensor bytes, the float set.
#include "csrc/core/ir/dtype.h"

namespace torch_ort {

namespace {

struct DTypeInfo {
  std::string_view name;  // torch-style spelling: error messages are read by PyTorch users
  int64_t size;           // bytes per element; 0 where a fixed size does not exist
  bool floating;          // the types gradients flow through
};

// Indexed by the ONNX TensorProto.DataType code (== static_cast<int>(DType)).
constexpr DTypeInfo kTable[] = {
    {"undefined", 0, false},   // 0
    {"float32", 4, true},      // 1  kFloat
    {"uint8", 1, false},       // 2
    {"int8", 1, false},        // 3
    {"uint16", 2, false},      // 4
    {"int16", 2, false},       // 5
    {"int32", 4, false},       // 6
    {"int64", 8, false},       // 7
    {"string", 0, false},      // 8  variable length: never stored as raw bytes
    {"bool", 1, false},        // 9
    {"float16", 2, true},      // 10
    {"float64", 8, true},      // 11 kDouble
    {"uint32", 4, false},      // 12
    {"uint64", 8, false},      // 13
    {"complex64", 8, false},   // 14 not differentiated by our rules
    {"complex128", 16, false}, // 15
    {"bfloat16", 2, true},     // 16
};
constexpr int32_t kNumCodes = static_cast<int32_t>(sizeof(kTable) / sizeof(kTable[0]));

const DTypeInfo* info(DType t) {
  const auto code = static_cast<int32_t>(t);
  return (code >= 0 && code < kNumCodes) ? &kTable[code] : nullptr;
}

}  // namespace

std::string_view dtype_name(DType t) {
  const DTypeInfo* i = info(t);
  return i ? i->name : std::string_view("invalid-dtype");
}

bool is_floating(DType t) {
  const DTypeInfo* i = info(t);
  return i && i->floating;
}

int64_t dtype_size(DType t) {
  const DTypeInfo* i = info(t);
  return i ? i->size : 0;
}

// True for the element types the IR knows (1..16). 0 (undefined) and newer ONNX types
// (float8, int4, ...) are not valid element types for a value.
bool is_valid_dtype(int32_t code) { return code > 0 && code < kNumCodes; }

}  // namespace torch_ort
