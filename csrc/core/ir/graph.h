// The IR: an SSA graph of ONNX-style nodes over named, typed, symbolically shaped values.
// A Node owns no tensors, only value ids and attributes; constant data lives in initializers.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "csrc/core/ir/attribute.h"
#include "csrc/core/ir/dtype.h"
#include "csrc/core/ir/shape.h"

namespace torch_ort {

using ValueId = int32_t;
using NodeId = int32_t;
inline constexpr ValueId kNoValue = -1;  // an omitted optional input/output, or "no gradient"
inline constexpr const char* kOurDomain = "com.torch_ort";  // our fused and gradient ops

struct Value {
  std::string name;  // unique within the graph
  DType dtype = DType::kUndefined;
  Shape shape;
};

struct Node {
  std::string domain;              // "" (ai.onnx) or kOurDomain
  std::string op_type;             // "MatMul"
  std::string name;                // for error messages: the exporter's node name, or ours
  std::vector<ValueId> inputs;     // kNoValue marks an omitted optional input
  std::vector<ValueId> outputs;    // kNoValue marks an omitted optional output
  Attributes attrs;
  // Training graphs: the node runs in the backward call. Passes over a training graph give a node
  // they create the phase of the node it replaces (see run_training_pipeline).
  bool in_backward = false;

  std::string describe() const;  // "Gemm (node /fc1/Gemm)"
};

// An ONNX Constant node: its value is an attribute (value, value_float, value_ints, ...; read by
// pattern::constant_node_data). The one test every stage uses.
inline bool is_constant(const Node& n) { return n.op_type == "Constant" && n.domain.empty() && n.inputs.empty(); }

class Graph {
 public:
  // --- values: ids are stable for the graph's lifetime; names are unique.
  ValueId add_value(const std::string& name, DType dtype, Shape shape);  // throws if name is taken
  ValueId new_value(std::string_view hint, DType dtype, Shape shape);    // uniquified name
  const Value& value(ValueId id) const { return values_.at(static_cast<size_t>(id)); }
  Value& value(ValueId id) { return values_.at(static_cast<size_t>(id)); }
  std::optional<ValueId> find(std::string_view name) const;
  int32_t num_values() const { return static_cast<int32_t>(values_.size()); }
  std::string unique_node_name(std::string_view hint);

  // --- structure, edited directly by importers, passes and the gradient builder.
  std::string name = "graph";
  std::vector<Node> nodes;                      // kept in topological order (see topo.h)
  std::vector<ValueId> inputs;                  // bound at run time (user inputs, then parameters)
  std::vector<ValueId> outputs;
  std::map<ValueId, TensorData> initializers;   // constants baked into the graph (not inputs)
  std::map<std::string, int64_t> opset_imports{{"", 20}, {kOurDomain, 1}};

 private:
  // A deque, not a vector: a `const Value&` from value() stays valid while new values are
  // added (gradient builders hold one across new_value()).
  std::deque<Value> values_;
  std::unordered_map<std::string, ValueId> by_name_;
  int64_t name_counter_ = 0;
  // unique_node_name's memory of names in use: nodes[0, node_names_scanned_) were already seen.
  // Nodes are edited directly, so this is a cache that only ever grows (never a false "free").
  std::unordered_set<std::string> node_names_seen_;
  size_t node_names_scanned_ = 0;
};

// Derived views, recomputed on demand so that they are never stale.
struct GraphIndex {
  explicit GraphIndex(const Graph& g);
  std::vector<NodeId> producer;                 // per value: producing node, -1 for inputs/constants
  std::vector<std::vector<NodeId>> consumers;   // per value: nodes reading it (once per node)
};

}  // namespace torch_ort
