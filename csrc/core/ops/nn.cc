// Normalisation, softmax and losses (shapes/rules_nn.cc).
#include "csrc/core/ops/families.h"

namespace torch_ort::ops {

std::vector<OpEntry> nn_ops() {
  return {
      // Mean and InvStdDev (outputs 1, 2) for the gradient.
      {"", "LayerNormalization", {.recomputable = true, .grad_needs_optional_outputs = true}},
      {"", "LogSoftmax", {.recomputable = true}},
      {"", "Softmax", {.recomputable = true}},
      // Its log-probabilities (output 1, B·T·vocab) for the gradient softmax − onehot; recomputed
      // from the logits (a graph output).
      {"", "SoftmaxCrossEntropyLoss", {.recomputable = true, .grad_needs_optional_outputs = true}},
      {kOurDomain, "CrossEntropyLoss", {.grad_needs_optional_outputs = true}},
  };
}

}  // namespace torch_ort::ops
