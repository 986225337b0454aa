// Graph bookkeeping: value creation with unique names, node naming, and derived indexes.
#include "csrc/core/ir/graph.h"

#include <stdexcept>

namespace torch_ort {

std::string Node::describe() const {
  // The domain is shown only for non-default ops, so "Gemm (node /fc1/Gemm)" stays short.
  std::string s;
  if (!domain.empty()) s = domain + "::";
  s += op_type.empty() ? std::string("<no op_type>") : op_type;
  return s + (name.empty() ? std::string(" (unnamed node)") : " (node " + name + ")");
}

ValueId Graph::add_value(const std::string& name, DType dtype, Shape shape) {
  if (name.empty()) {
    throw std::invalid_argument("Graph::add_value: a value needs a non-empty name "
                                "(the empty name means 'omitted' in ONNX)");
  }
  if (by_name_.count(name)) {
    throw std::invalid_argument("Graph::add_value: value name '" + name + "' is already taken");
  }
  const auto id = static_cast<ValueId>(values_.size());
  values_.push_back(Value{name, dtype, std::move(shape)});
  by_name_.emplace(name, id);
  return id;
}

ValueId Graph::new_value(std::string_view hint, DType dtype, Shape shape) {
  std::string base = hint.empty() ? std::string("v") : std::string(hint);
  std::string candidate = base;
  while (by_name_.count(candidate)) candidate = base + "_" + std::to_string(name_counter_++);
  return add_value(candidate, dtype, std::move(shape));
}

std::optional<ValueId> Graph::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::string Graph::unique_node_name(std::string_view hint) {
  // Passes append nodes directly, so pick up names added since the last call. Amortized O(1):
  // a linear scan per call would make autodiff quadratic in the node count.
  if (node_names_scanned_ > nodes.size()) node_names_scanned_ = 0;  // nodes were rebuilt
  for (; node_names_scanned_ < nodes.size(); ++node_names_scanned_) {
    node_names_seen_.insert(nodes[node_names_scanned_].name);
  }
  std::string base = hint.empty() ? std::string("node") : std::string(hint);
  std::string candidate = base;
  while (node_names_seen_.count(candidate)) candidate = base + "_" + std::to_string(name_counter_++);
  node_names_seen_.insert(candidate);
  return candidate;
}

GraphIndex::GraphIndex(const Graph& g)
    : producer(static_cast<size_t>(g.num_values()), -1),
      consumers(static_cast<size_t>(g.num_values())) {
  const auto in_range = [&](ValueId v) { return v >= 0 && v < g.num_values(); };
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodes.size()); ++n) {
    const Node& node = g.nodes[n];
    for (ValueId v : node.outputs) {
      if (in_range(v)) producer[v] = n;
    }
    for (ValueId v : node.inputs) {
      // "once per node": a node reading x twice (Mul(x, x)) is one consumer of x.
      if (in_range(v) && (consumers[v].empty() || consumers[v].back() != n)) {
        consumers[v].push_back(n);
      }
    }
  }
}

}  // namespace torch_ort
