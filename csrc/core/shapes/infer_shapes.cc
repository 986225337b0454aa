// The shape inference pass: one walk in node order, values of shape chains carried alongside.
#include "csrc/core/shapes/infer_shapes.h"

#include <unordered_map>

#include "csrc/core/ir/errors.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort {
namespace {

std::string where(const Graph& g, const Node& n, size_t k) {
  return "'" + g.value(n.outputs[k]).name + "' (output " + std::to_string(k) + " of " +
         n.describe() + ")";
}

// Merges an inferred shape into the one the graph holds: fills what is unknown, keeps what is
// known, and throws on a provable contradiction.
void merge(Graph& g, const Node& n, size_t k, const Shape& inferred) {
  if (!inferred.rank_known) return;
  Shape& held = g.value(n.outputs[k]).shape;
  if (!held.rank_known) {
    held = inferred;
    return;
  }
  const auto contradiction = [&] {
    throw ShapeInferenceError("shape inference: the graph gives " + where(g, n, k) + " the shape " +
                      held.to_string() + ", but " + n.op_type + " computes " + inferred.to_string());
  };
  if (held.dims.size() != inferred.dims.size()) contradiction();
  for (size_t d = 0; d < held.dims.size(); ++d) {
    Dim& h = held.dims[d];
    const Dim& i = inferred.dims[d];
    if (h.is_known() && i.is_known() && h.value != i.value) contradiction();
    if (!h.is_known() && !h.is_symbolic()) h = i;
  }
}

bool dims_named(const Shape& s) {
  if (!s.rank_known) return false;
  for (const Dim& d : s.dims)
    if (!d.is_known() && !d.is_symbolic()) return false;
  return true;
}

}  // namespace

ShapeCoverage infer_shapes(Graph& g) {
  for (ValueId v = 0; v < g.num_values(); ++v)
    for (Dim& d : g.value(v).shape.dims) d = canonical(d);
  std::unordered_map<ValueId, SymValues> values;  // known elements of small int values
  for (const Node& n : g.nodes) {
    ShapeCtx c = run_shape_rule(g, n, &values);
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (n.outputs[k] == kNoValue) continue;
      merge(g, n, k, c.out_shapes[k]);
      if (c.out_values[k]) values[n.outputs[k]] = std::move(*c.out_values[k]);
    }
  }
  return shape_coverage(g);
}

std::vector<ValueId> values_in_graph(const Graph& g) {
  std::vector<char> in_graph(g.num_values(), 0);
  for (ValueId v : g.inputs) in_graph[v] = 1;
  for (const auto& [v, _] : g.initializers) in_graph[v] = 1;
  for (const Node& n : g.nodes)
    for (const auto* list : {&n.inputs, &n.outputs})
      for (ValueId v : *list)
        if (v != kNoValue) in_graph[v] = 1;
  std::vector<ValueId> out;
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (in_graph[v]) out.push_back(v);
  return out;
}

ShapeCoverage shape_coverage(const Graph& g) {
  ShapeCoverage c;
  for (ValueId v : values_in_graph(g)) {
    ++c.num_values;
    const Shape& s = g.value(v).shape;
    if (s.rank_known) ++c.num_rank_known;
    else c.rank_unknown.push_back(v);
    if (dims_named(s)) ++c.num_dims_named;
  }
  return c;
}

std::vector<Shape> infer_node_shapes(const Graph& g, const Node& n) {
  return run_shape_rule(g, n, nullptr).out_shapes;
}

}  // namespace torch_ort
