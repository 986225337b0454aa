// Tiny helpers for hand-written IR graphs in the core tests (value and node one-liners).
#pragma once

#include <string>
#include <vector>

#include "csrc/core/ir/graph.h"

namespace torch_ort::testing {

// A float32 value of shape [batch, n] (symbolic batch), the common case in the tests.
inline ValueId fvalue(Graph& g, const std::string& name, int64_t n = 4) {
  return g.add_value(name, DType::kFloat, Shape::of({Dim::symbolic("batch"), Dim::known(n)}));
}

// Shapes in one line: dims({sym("B"), known(8)}).
inline Shape dims(std::vector<Dim> d) { return Shape::of(std::move(d)); }
inline Dim known(int64_t v) { return Dim::known(v); }
inline Dim sym(const char* name) { return Dim::symbolic(name); }

// How many nodes run op_type (any domain).
inline int count_ops(const Graph& g, const std::string& op_type) {
  int n = 0;
  for (const Node& node : g.nodes) n += node.op_type == op_type;
  return n;
}

inline Node& add_node(Graph& g, const std::string& op, std::vector<ValueId> inputs,
                      std::vector<ValueId> outputs, const std::string& name,
                      const std::string& domain = "") {
  Node n;
  n.domain = domain;
  n.op_type = op;
  n.name = name;
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  g.nodes.push_back(std::move(n));
  return g.nodes.back();
}

}  // namespace torch_ort::testing
