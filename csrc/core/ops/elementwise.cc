// Elementwise ops (shapes/rules_elementwise.cc): arithmetic, activations, comparisons, casts.
// Dropout is in random.cc.
#include "csrc/core/ops/families.h"

namespace torch_ort::ops {

std::vector<OpEntry> elementwise_ops() {
  using enum FusedInstr;
  using enum ViewRule;
  const std::vector<DType> kBoolOut{DType::kBool};
  return {
      {"", "Abs", {.recomputable = true, .host_computable = true}},
      {"", "Add", {.fused = kBinary, .commutative = true, .recomputable = true, .host_computable = true,
                   .inplace_inputs = {0, 1}}},
      {"", "And", {.commutative = true, .recomputable = true, .host_computable = true,
                   .output_dtypes = kBoolOut}},
      {"", "Cast", {.recomputable = true, .host_computable = true, .view = kSameDtype}},
      {"", "CastLike", {.host_computable = true, .view = kSameDtype}},
      {"", "Div", {.fused = kBinary, .recomputable = true, .host_computable = true, .inplace_inputs = {0}}},
      {"", "Equal", {.commutative = true, .recomputable = true, .host_computable = true,
                     .output_dtypes = kBoolOut}},
      {"", "Erf", {.fused = kUnary, .recomputable = true}},
      {"", "Exp", {.fused = kUnary, .recomputable = true, .host_computable = true}},
      {"", "Gelu", {.recomputable = true}},
      {"", "Greater", {.recomputable = true, .host_computable = true, .output_dtypes = kBoolOut}},
      {"", "GreaterOrEqual", {.recomputable = true, .host_computable = true, .output_dtypes = kBoolOut}},
      {"", "Identity", {.recomputable = true, .host_computable = true, .view = kInput0}},
      {"", "IsInf", {.output_dtypes = kBoolOut}},
      {"", "IsNaN", {.output_dtypes = kBoolOut}},
      {"", "Less", {.recomputable = true, .host_computable = true, .output_dtypes = kBoolOut}},
      {"", "LessOrEqual", {.recomputable = true, .host_computable = true, .output_dtypes = kBoolOut}},
      {"", "Log", {.fused = kUnary, .recomputable = true, .host_computable = true}},
      {"", "Max", {.commutative = true, .recomputable = true, .host_computable = true}},
      {"", "Mean", {.commutative = true}},
      {"", "Min", {.commutative = true, .recomputable = true, .host_computable = true}},
      {"", "Mul", {.fused = kBinary, .commutative = true, .recomputable = true, .host_computable = true,
                   .inplace_inputs = {0, 1}}},
      {"", "Neg", {.fused = kUnary, .recomputable = true, .host_computable = true}},
      {"", "Not", {.recomputable = true, .host_computable = true, .output_dtypes = kBoolOut}},
      {"", "Or", {.commutative = true, .recomputable = true, .host_computable = true,
                  .output_dtypes = kBoolOut}},
      {"", "Pow", {.fused = kBinary, .recomputable = true, .host_computable = true}},
      {"", "Reciprocal", {.fused = kUnary, .recomputable = true}},
      {"", "Relu", {.fused = kUnary, .recomputable = true}},
      {"", "Sigmoid", {.fused = kUnary, .recomputable = true}},
      {"", "Sqrt", {.fused = kUnary, .recomputable = true, .host_computable = true}},
      {"", "Sub", {.fused = kBinary, .recomputable = true, .host_computable = true, .inplace_inputs = {0}}},
      // The kernel sums into operand 0; a lone operand passes through.
      {"", "Sum", {.commutative = true, .host_computable = true, .inplace_inputs = {0}, .view = kSingleSum}},
      {"", "Tanh", {.fused = kUnary, .recomputable = true}},
      {"", "Trilu", {.host_inputs = {1}}},  // k
      {"", "Where", {.recomputable = true, .host_computable = true}},
      {"", "Xor", {.commutative = true, .host_computable = true, .output_dtypes = kBoolOut}},
  };
}

}  // namespace torch_ort::ops
