// Data-producing ops (shapes/rules_data.cc): sizes, constants and ranges, Concat, Slice.
#include "csrc/core/ops/families.h"

namespace torch_ort::ops {

std::vector<OpEntry> data_ops() {
  using enum ViewRule;
  const std::vector<DType> kInt64Out{DType::kInt64};
  return {
      {"", "Concat", {.recomputable = true, .host_computable = true}},
      {"", "ConstantOfShape", {.recomputable = true, .host_computable = true, .host_inputs = {0}}},  // shape
      // host inputs: start, limit, delta
      {"", "Range", {.recomputable = true, .host_computable = true, .host_inputs = {0, 1, 2}}},
      {"", "Shape", {.reads_metadata_only = true, .output_dtypes = kInt64Out}},
      {"", "Size", {.reads_metadata_only = true, .output_dtypes = kInt64Out}},
      // host inputs: starts, ends, axes, steps
      {"", "Slice",
       {.recomputable = true, .host_computable = true, .host_inputs = {1, 2, 3, 4}, .view = kSlice}},
  };
}

}  // namespace torch_ort::ops
