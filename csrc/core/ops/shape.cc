// Shape ops (shapes/rules_shape.cc): the ones whose output is a view of their input, and Tile, Pad.
#include "csrc/core/ops/families.h"

namespace torch_ort::ops {

std::vector<OpEntry> shape_ops() {
  using enum ViewRule;
  return {
      {"", "Expand", {.recomputable = true, .host_computable = true, .host_inputs = {1}, .view = kExpand}},  // shape
      {"", "Flatten", {.recomputable = true, .host_computable = true, .view = kReshape}},
      {"", "Pad", {.host_inputs = {1, 2, 3}}},  // pads, constant_value, axes
      {"", "Reshape", {.recomputable = true, .host_computable = true, .host_inputs = {1}, .view = kReshape}},  // shape
      {"", "Squeeze", {.recomputable = true, .host_computable = true, .host_inputs = {1}, .view = kSqueeze}},  // axes
      {"", "Tile", {.host_computable = true, .host_inputs = {1, 2}}},  // repeats (and opset 1's axis)
      {"", "Transpose", {.recomputable = true, .host_computable = true, .view = kTranspose}},
      {"", "Unsqueeze", {.recomputable = true, .host_computable = true, .host_inputs = {1}, .view = kUnsqueeze}},  // axes
  };
}

}  // namespace torch_ort::ops
