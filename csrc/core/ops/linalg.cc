// Linear algebra and pooling (shapes/rules_linalg.cc).
#include "csrc/core/ops/families.h"

namespace torch_ort::ops {

std::vector<OpEntry> linalg_ops() {
  return {
      {"", "Gemm", {.recomputable = true}},
      {"", "MatMul", {.recomputable = true}},
      // Indices (output 1): the gradient adds dY at the forward's argmax.
      {"", "MaxPool", {.output_dtypes = {DType::kUndefined, DType::kInt64}, .grad_needs_optional_outputs = true}},
  };
}

}  // namespace torch_ort::ops
