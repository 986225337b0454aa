// Reference evaluator (test oracle): runs an IR graph node by node in double precision, torch-free.
// Covers the forward ops of MLP models and every op our gradient rules emit; slow and simple on
// purpose. Integers and bools are stored as doubles; the dtype is kept so shapes/indices stay ints.
// The ops of the core evaluator (csrc/core/eval/eval.h: shape arithmetic, Cast, Add/Sub/Mul/Div,
// Gather, Slice, ...) are not written here: eval_node hands them to it, which constant folding
// uses too, so their meaning is written once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <limits>
#include <map>
#include <vector>

#include "csrc/core/ir/graph.h"

namespace torch_ort::ref {

struct RefTensor {
  DType dtype = DType::kDouble;  // float types are NOT rounded: float and double compute alike
  std::vector<int64_t> shape;    // {} for a scalar
  std::vector<double> data;      // row-major, numel() entries

  int64_t numel() const;
  static RefTensor zeros(DType dtype, std::vector<int64_t> shape);
  static RefTensor ints(const std::vector<int64_t>& v);  // 1-D int64
};

using Dims = std::vector<int64_t>;
using Outs = std::vector<RefTensor>;

// Shared by every op file of the oracle: an error naming the op and node, and a product of dims.
[[noreturn]] void fail(const Node& n, const std::string& why);
int64_t prod(const Dims& s, size_t begin = 0, size_t end = SIZE_MAX);
// Row-major multi-index <-> linear offset within shape s.
Dims unravel(int64_t lin, const Dims& s);
int64_t ravel(const Dims& idx, const Dims& s);

// Decodes an initializer / Constant payload (float, double, int64, int32, bool, int8, uint8).
RefTensor from_tensor_data(const TensorData& t);

// Runs one node on its inputs (nullptr for an omitted optional input). Returns one tensor per
// output the op defines (callers drop those the node omits). Throws std::runtime_error naming the
// op and node for unknown ops or bad inputs.
std::vector<RefTensor> eval_node(const Node& n, const std::vector<const RefTensor*>& in);

// Ops added from other files (one file per op family), looked up after the built-in tables:
//   static const bool kReg = ref::register_op("", "Gelu", [](const Node& n, const Ins& in) {...});
using Ins = std::vector<const RefTensor*>;
using OpFn = std::function<std::vector<RefTensor>(const Node&, const Ins&)>;
bool register_op(const std::string& domain, const std::string& op, OpFn fn);

// Evaluates g.nodes[0, max_nodes) in order. `feeds` binds graph inputs (or any other value, e.g.
// gradient inputs of a training graph); initializers are read from g. Returns every value known
// at the end: feeds, initializers and all node outputs.
std::map<ValueId, RefTensor> evaluate(const Graph& g, const std::map<ValueId, RefTensor>& feeds,
                                      size_t max_nodes = std::numeric_limits<size_t>::max());

}  // namespace torch_ort::ref
