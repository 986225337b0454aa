// How many inputs and outputs each op the core knows takes, and which leading ones are required:
// the ONNX operator schemas for the default domain (a generated table, op_arity.cc), the code that
// builds them for ours (the `arity` of each op's traits line, csrc/core/ops/<family>.cc). verify()
// holds every node of a known op to it, so no later stage (shape rule, pass, gradient rule,
// planner) meets a Cast without input 0 or a MaxPool without output 0. Ops not in the table
// stay unchecked here (no rule of ours reads them by position).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "csrc/core/ir/graph.h"

namespace torch_ort {

inline constexpr int kVariadic = std::numeric_limits<int>::max();  // no upper bound

struct OpArity {
  int min_inputs = 0;             // slots [0, min_inputs) exist and are present (not kNoValue)...
  int max_inputs = kVariadic;     // ...and there are at most this many slots
  int min_outputs = 0;
  int max_outputs = kVariadic;
  uint32_t optional_inputs = 0;   // ...except bit i: slot i < min_inputs exists but may be kNoValue
  uint32_t optional_outputs = 0;  //    (ours: a gradient op keeps the position of an unneeded one)
};

// The bit set of `ids`, for OpArity's optional_inputs / optional_outputs: slots({0, 2}).
constexpr uint32_t slots(std::initializer_list<int> ids) {
  uint32_t bits = 0;
  for (int i : ids) bits |= uint32_t{1} << i;
  return bits;
}

// The arity of `op_type` in `domain` ("" for ONNX's default) for a graph importing `opset` of
// that domain, or nullopt for an op the table does not know. Where the schema changed across
// opsets (Slice's starts/ends became inputs in 10, Unsqueeze's axes in 13), the node may take the
// form in force at `opset` or any later one, since the core's own rules emit the newest forms
// (Unsqueeze(x, axes), Gemm without C) into graphs of any opset: the loosest of those forms.
std::optional<OpArity> find_op_arity(std::string_view domain, std::string_view op_type, int64_t opset);

// "" when n's input and output slots fit its op's arity (or the op is not in the table), else
// what is wrong: "needs at least 2 inputs, has 1", "input 0 is required", "takes at most 3
// inputs, has 5", "output 0 is required". The opset is the graph's import of n's domain.
std::string arity_problem(const Graph& g, const Node& n);

// "domain::op" of every entry ("::MatMul", "com.torch_ort::ReluGrad"), as ShapeRegistry::ops().
std::vector<std::string> arity_ops();

}  // namespace torch_ort
