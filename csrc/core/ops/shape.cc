// Shape ops (shapes/rules_shape.cc): the ones whose output is a view of their input, and Tile, Pad.
#include "csrc/core/ops/families.h"

namespace torch_ort::ops {

std::vector<OpEntry> shape_ops() {
  using enum ViewRule;
  return {
      // host inputs: shape
      {"", "Expand", {.recomputable = true, .host_computable = true, .host_inputs = {1}, .view = kExpand}},
      {"", "Flatten", {.recomputable = true, .host_computable = true, .view = kReshape}},
      {"", "Pad", {.host_inputs = {1, 2, 3}}},  // pads, constant_value, axes
      // host inputs: shape
      {"", "Reshape", {.recomputable = true, .host_computable = true, .host_inputs = {1}, .view = kReshape}},
      // host inputs: axes
      {"", "Squeeze", {.recomputable = true, .host_computable = true, .host_inputs = {1}, .view = kSqueeze}},
      {"", "Tile", {.host_computable = true, .host_inputs = {1, 2}}},  // repeats (and opset 1's axis)
      {"", "Transpose", {.recomputable = true, .host_computable = true, .view = kTranspose}},
      // host inputs: axes
      {"", "Unsqueeze",
       {.recomputable = true, .host_computable = true, .host_inputs = {1}, .view = kUnsqueeze}},
  };
}

}  // namespace torch_ort::ops
