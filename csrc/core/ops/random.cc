// Ops that draw random numbers, and DropoutGrad, which replays their mask.
//
// `random` is the one notion both cse and recompute need: the op's outputs are a fresh draw, so
// two equal nodes differ (never merged) and a clone would not reproduce them (never recomputed).
// DropoutGrad is not random: it reads the forward's mask and is deterministic.
#include "csrc/core/ops/families.h"

namespace torch_ort::ops {

std::vector<OpEntry> random_ops() {
  using enum ViewRule;
  return {
      // ratio, training_mode on the host; the mask (output 1) for the gradient, never a new draw.
      {"", "Dropout", {.random = true, .host_inputs = {1, 2}, .view = kDropout,
                       .output_dtypes = {DType::kUndefined, DType::kBool}, .grad_needs_optional_outputs = true}},
      {"", "Bernoulli", {.random = true}},
      {"", "Multinomial", {.random = true}},
      {"", "RandomNormal", {.random = true}},
      {"", "RandomNormalLike", {.random = true}},
      {"", "RandomUniform", {.random = true}},
      {"", "RandomUniformLike", {.random = true}},
      // host inputs: ratio, training_mode
      {kOurDomain, "BiasDropout", {.random = true, .host_inputs = {3, 4}, .view = kBiasDropout}},
      {kOurDomain, "DropoutGrad", {.host_inputs = {2, 3}, .view = kDropoutGrad}},  // ratio, training_mode
  };
}

}  // namespace torch_ort::ops
