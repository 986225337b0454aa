// Reductions (shapes/rules_reduce.cc), ArgMax/ArgMin, and our reduction gradients.
#include "csrc/core/ops/families.h"

namespace torch_ort::ops {

std::vector<OpEntry> reduce_ops() {
  using enum ViewRule;
  const std::vector<DType> kInt64Out{DType::kInt64};
  return {
      {"", "ArgMax", {.output_dtypes = kInt64Out}},
      {"", "ArgMin", {.output_dtypes = kInt64Out}},
      {"", "CumSum", {.host_inputs = {1}}},  // axis
      // host input 1: axes (opset 18+; ReduceSum 13+)
      {"", "ReduceMax", {.host_computable = true, .host_inputs = {1}}},
      {"", "ReduceMean", {.host_computable = true, .host_inputs = {1}, .view = kReduceNoop}},
      {"", "ReduceMin", {.host_computable = true, .host_inputs = {1}}},
      {"", "ReduceProd", {.host_computable = true, .host_inputs = {1}}},
      {"", "ReduceSum", {.host_computable = true, .host_inputs = {1}, .view = kReduceNoop}},
      {kOurDomain, "ReduceMeanGrad", {.host_inputs = {1, 2}}},  // shape(X), axes
      {kOurDomain, "ReduceSumGrad", {.host_inputs = {1, 2}, .view = kSpread}},
      {kOurDomain, "SumToShape", {.host_inputs = {1}, .view = kIfSameShape}},  // shape
  };
}

}  // namespace torch_ort::ops
