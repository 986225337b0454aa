// Indexing ops (shapes/rules_index.cc): Gather, Split, NonZero.
#include "csrc/core/ops/families.h"

namespace torch_ort::ops {

std::vector<OpEntry> index_ops() {
  using enum ViewRule;
  return {
      {"", "Gather", {.recomputable = true, .host_computable = true}},
      {"", "NonZero", {.output_dtypes = {DType::kInt64}}},
      // Split: split
      {"", "Split", {.recomputable = true, .host_computable = true, .host_inputs = {1}, .view = kSplit}},
  };
}

}  // namespace torch_ort::ops
