// The IR <-> ATen dtype table and the conversion of constant data to CPU tensors.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "csrc/runtime/dtype.h"

#include <cstring>
#include <utility>

#include <ATen/ops/empty.h>

#include "csrc/core/ir/errors.h"

namespace torch_ort {
namespace {

// One row per IR dtype the runtime takes; everything else (string, complex) is an error.
constexpr std::pair<DType, at::ScalarType> kTable[] = {
    {DType::kFloat, at::kFloat},      {DType::kDouble, at::kDouble},
    {DType::kFloat16, at::kHalf},     {DType::kBFloat16, at::kBFloat16},
    {DType::kInt8, at::kChar},        {DType::kInt16, at::kShort},
    {DType::kInt32, at::kInt},        {DType::kInt64, at::kLong},
    {DType::kUInt8, at::kByte},       {DType::kUInt16, at::kUInt16},
    {DType::kUInt32, at::kUInt32},    {DType::kUInt64, at::kUInt64},
    {DType::kBool, at::kBool},
};
// Complex is left out on purpose: ONNX ops have no agreed complex semantics, and torch.onnx
// exports complex tensors as real ones with a trailing dim of 2.

}  // namespace

at::ScalarType to_aten(DType t, const std::string& what) {
  for (const auto& [ir, aten] : kTable)
    if (ir == t) return aten;
  throw UnsupportedOpError("dtype '" + std::string(dtype_name(t)) + "' of " + what +
                           " has no ATen equivalent; the runtime cannot hold it");
}

DType from_aten(at::ScalarType t) {
  for (const auto& [ir, aten] : kTable)
    if (aten == t) return ir;
  return DType::kUndefined;
}

at::Tensor tensor_from_data(const TensorData& d, const std::string& what) {
  at::Tensor t = at::empty(d.dims, at::TensorOptions().dtype(to_aten(d.dtype, what)));
  const size_t want = static_cast<size_t>(t.numel()) * t.element_size();
  if (d.raw.size() != want)
    throw OnnxImportError(what + ": constant data holds " + std::to_string(d.raw.size()) +
                          " bytes, but dtype " + std::string(dtype_name(d.dtype)) + " and shape " +
                          std::to_string(t.numel()) + " elements need " + std::to_string(want));
  // Raw ONNX data is little-endian, as is every host we build for.
  if (want != 0) std::memcpy(t.data_ptr(), d.raw.data(), want);
  return t;
}

std::string aten_dtype_name(at::ScalarType t) {
  const DType d = from_aten(t);
  return d == DType::kUndefined ? std::string(c10::toString(t)) : std::string(dtype_name(d));
}

std::string sizes_str(c10::IntArrayRef s) { return c10::str(s); }

}  // namespace torch_ort
