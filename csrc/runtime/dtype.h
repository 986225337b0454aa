// The one table between IR element types and ATen scalar types, and constant data -> at::Tensor.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "csrc/core/ir/attribute.h"
#include "csrc/core/ir/dtype.h"

namespace torch_ort {

// Throws UnsupportedOpError naming the dtype and `what` (e.g. "input 'x'") when ATen has none.
at::ScalarType to_aten(DType t, const std::string& what);
// kUndefined for ATen types the IR cannot express (quantized, complex32, ...).
DType from_aten(at::ScalarType t);
// For error messages: the IR's name of an ATen type ("float32"; ATen's own when the IR has none),
// and sizes as "[2, 3]".
std::string aten_dtype_name(at::ScalarType t);
std::string sizes_str(c10::IntArrayRef s);
// A CPU tensor holding a copy of `d` (initializers, Constant values). `what` names it in errors.
at::Tensor tensor_from_data(const TensorData& d, const std::string& what);

}  // namespace torch_ort
