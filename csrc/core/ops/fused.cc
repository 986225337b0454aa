// Our fused ops (passes/*_fusion.cc; shapes/rules_fused_*.cc, rules_attention.cc).
#include "csrc/core/ops/families.h"

namespace torch_ort::ops {

std::vector<OpEntry> fused_ops() {
  return {
      {kOurDomain, "Attention", {.recomputable = true}},
      {kOurDomain, "BiasGelu", {.recomputable = true}},
      // Its kernel is plain ATen arithmetic on small host tensors too.
      {kOurDomain, "FusedElementwise", {.recomputable = true, .host_computable = true}},
      {kOurDomain, "FusedMatMul", {.recomputable = true}},
      {kOurDomain, "SkipLayerNorm", {.recomputable = true}},
  };
}

}  // namespace torch_ort::ops
