// Matching utilities shared by the rewrite passes: op tests, constants (initializer or Constant
// node), single-use checks, and the two edits every pass is allowed (rewrite a node in place,
// remove nodes), so that a pass run after autodiff keeps each node in its forward/backward half.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "csrc/core/ir/graph.h"

namespace torch_ort::pattern {

// An ONNX-domain op of this type (domain "": the importer normalizes "ai.onnx").
inline bool is_onnx(const Node& n, std::string_view op) {
  return n.op_type == op && n.domain.empty();
}
// An op of our domain (com.torch_ort) of this type.
inline bool is_ours(const Node& n, std::string_view op) { return n.op_type == op && n.domain == kOurDomain; }

// A classification loss with logits and labels: ONNX's SoftmaxCrossEntropyLoss, or ours with
// label smoothing.
inline bool is_cross_entropy(const Node& n) {
  return is_onnx(n, "SoftmaxCrossEntropyLoss") || is_ours(n, "CrossEntropyLoss");
}

inline bool is_graph_output(const Graph& g, ValueId v) {
  for (ValueId o : g.outputs)
    if (o == v) return true;
  return false;
}

// Input i is present (not an omitted optional input).
inline bool has_input(const Node& n, size_t i) { return i < n.inputs.size() && n.inputs[i] != kNoValue; }

// The node producing v, or nullptr for inputs, initializers and omitted values.
inline const Node* producer(const Graph& g, const GraphIndex& idx, ValueId v) {
  if (v < 0 || v >= static_cast<ValueId>(idx.producer.size()) || idx.producer[v] < 0) return nullptr;
  return &g.nodes[idx.producer[v]];
}

// v is read by node `reader` only, and is no graph output: folding it into `reader` loses nothing.
inline bool only_read_by(const Graph& g, const GraphIndex& idx, ValueId v, NodeId reader) {
  return idx.consumers[v].size() == 1 && idx.consumers[v][0] == reader && !is_graph_output(g, v);
}

// The rank of v when known, else -1.
inline int64_t rank_of(const Graph& g, ValueId v) { return g.value(v).shape.rank(); }

// The data of a Constant node (value / value_int(s) / value_float(s)); nullopt for forms we do not
// read (sparse_value, strings).
inline std::optional<TensorData> constant_node_data(const Node& n) {
  const Attributes& a = n.attrs;
  if (const TensorData* t = a.get_tensor("value")) return *t;
  if (a.has("value_int")) return TensorData::from_int64s({a.get_int("value_int", 0)}, true);
  if (a.has("value_ints")) return TensorData::from_int64s(a.get_ints("value_ints", {}));
  if (a.has("value_float")) return TensorData::scalar_float(DType::kFloat, a.get_float("value_float", 0.0f));
  if (a.has("value_floats")) {
    TensorData t;
    t.dtype = DType::kFloat;
    const std::vector<float> fs = a.get_floats("value_floats", {});
    t.dims = {static_cast<int64_t>(fs.size())};
    t.raw.assign(reinterpret_cast<const char*>(fs.data()), fs.size() * sizeof(float));
    return t;
  }
  return std::nullopt;
}

// The constant data of v: an initializer, or the output of a Constant node; nullopt otherwise.
inline std::optional<TensorData> constant_of(const Graph& g, const GraphIndex& idx, ValueId v) {
  if (v == kNoValue) return std::nullopt;
  if (auto it = g.initializers.find(v); it != g.initializers.end()) return it->second;
  const Node* p = producer(g, idx, v);
  if (!p || !is_constant(*p)) return std::nullopt;
  try {
    return constant_node_data(*p);
  } catch (const std::exception&) {  // an attribute of the wrong kind: not a constant we read
    return std::nullopt;
  }
}

// The fewest classes a product feeding a cross-entropy must have to be treated as an LM head
// (label_sparsity, linear_cross_entropy_fusion): below it the head is cheap and left alone.
inline constexpr int64_t kLmHeadMinClasses = 1024;

// The value of a float scalar constant v (one element); nullopt otherwise.
inline std::optional<double> scalar_float(const Graph& g, const GraphIndex& idx, ValueId v) {
  std::optional<TensorData> t = constant_of(g, idx, v);
  if (!t || t->numel() != 1 || !is_floating(t->dtype)) return std::nullopt;
  try {
    return t->as_doubles().at(0);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// Integer values of a constant int32/int64 v; nullopt when v is no such constant.
inline std::optional<std::vector<int64_t>> constant_ints(const Graph& g, const GraphIndex& idx, ValueId v) {
  std::optional<TensorData> t = constant_of(g, idx, v);
  if (!t || (t->dtype != DType::kInt64 && t->dtype != DType::kInt32)) return std::nullopt;
  return t->as_int64s();
}

// A Transpose whose perm swaps the two innermost dims and keeps the others (rank >= 2); the ONNX
// default perm (all dims reversed) qualifies only for rank 2.
inline bool swaps_last_two(const Graph& g, const Node& t) {
  if (!is_onnx(t, "Transpose") || t.inputs.size() != 1 || t.inputs[0] == kNoValue) return false;
  const int64_t r = rank_of(g, t.inputs[0]);
  if (r < 2) return false;
  std::vector<int64_t> perm;
  try {
    perm = t.attrs.get_ints("perm", {});
  } catch (const std::exception&) {
    return false;
  }
  if (perm.empty()) return r == 2;
  if (static_cast<int64_t>(perm.size()) != r) return false;
  for (int64_t i = 0; i < r - 2; ++i)
    if (perm[i] != i) return false;
  return perm[r - 2] == r - 1 && perm[r - 1] == r - 2;
}

// Rewrites the node at `at` into `with` in place, keeping its training-graph phase.
inline void replace_node(Node& at, Node with) {
  with.in_backward = at.in_backward;
  at = std::move(with);
}

// Removes the flagged nodes, keeping the order of the rest; returns whether any went.
inline bool erase_nodes(Graph& g, const std::vector<char>& drop) {
  std::vector<Node> kept;
  kept.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!drop[i]) kept.push_back(std::move(g.nodes[i]));
  const bool changed = kept.size() != g.nodes.size();
  g.nodes = std::move(kept);
  return changed;
}

// bias adds one value per position of data's last dim: 1-D, of that dim, of data's dtype.
inline bool is_bias_of(const Graph& g, ValueId bias, ValueId data) {
  const Shape& b = g.value(bias).shape;
  const Shape& d = g.value(data).shape;
  return d.rank_known && d.rank() >= 1 && b.rank() == 1 && b.dims[0].same_as(d.dims.back()) &&
         g.value(bias).dtype == g.value(data).dtype;
}

}  // namespace torch_ort::pattern
