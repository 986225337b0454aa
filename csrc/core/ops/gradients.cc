// Our gradient ops (shapes/rules_gradients.cc): the inputs their kernels read on the host, and
// ConcatGrad's views. (Reduction gradients are in reduce.cc, DropoutGrad in random.cc.)
#include "csrc/core/ops/families.h"

namespace torch_ort::ops {

std::vector<OpEntry> gradient_ops() {
  using enum ViewRule;
  return {
      {kOurDomain, "AttentionGrad", {.host_inputs = {8}}},  // Backend (the forward's choice)
      {kOurDomain, "AveragePoolGrad", {.host_inputs = {1}}},  // shape(X)
      // (dY, shape(X_0), ..., shape(X_n-1)): every input past dY is on the host (placement.cc)
      {kOurDomain, "ConcatGrad", {.view = kSplit}},
      {kOurDomain, "EmbeddingGrad", {.host_inputs = {2}}},  // shape(W)
      {kOurDomain, "GatherElementsGrad", {.host_inputs = {1}}},  // shape(X)
      {kOurDomain, "GatherGrad", {.host_inputs = {1}}},
      {kOurDomain, "GatherNDGrad", {.host_inputs = {1}}},
      {kOurDomain, "MaxPoolGrad", {.host_inputs = {2}}},  // shape(X)
      {kOurDomain, "SliceGrad", {.host_inputs = {1, 2, 3, 4, 5}}},  // shape(X), starts, ends, axes, steps
      {kOurDomain, "SplitGrad", {.host_inputs = {0, 1}}},  // shape(X), split
      {kOurDomain, "TileGrad", {.host_inputs = {1}}},  // shape(X)
  };
}

}  // namespace torch_ort::ops
