// Symbolic shape inference over a whole graph: fills unknown shapes, checks the given ones.
#pragma once

#include <cstdint>
#include <vector>

#include "csrc/core/ir/graph.h"

namespace torch_ort {

struct ShapeCoverage {
  int64_t num_values = 0;         // values in the graph (inputs, initializers, node inputs/outputs)
  int64_t num_rank_known = 0;     // ... whose rank is known
  int64_t num_dims_named = 0;     // ... whose every dim is a known size or a (derived) symbol
  std::vector<ValueId> rank_unknown;  // the values of unknown rank, for reports
};

// Runs the shape rule of every node in order (the graph must be topologically sorted) and:
//  - sets the shape of each output whose shape is unknown, and fills unknown dims of a known
//    rank; a shape the graph already holds is never overwritten (only re-spelled canonically:
//    "s0 * s1" -> "s0*s1");
//  - checks it: a different rank, or two different known sizes, throws VerifyError naming the
//    node and the value. Ops without a rule leave their outputs as they are.
// Returns the coverage after inference.
ShapeCoverage infer_shapes(Graph& g);

// Coverage of the shapes the graph holds now.
ShapeCoverage shape_coverage(const Graph& g);

// The values that are part of the graph: inputs, initializers, and every node input and output
// (a training graph's output gradients included), in id order. Values a pass left behind are not.
std::vector<ValueId> values_in_graph(const Graph& g);

// Output shapes of one node, from its inputs' shapes and constant (initializer) inputs; for
// builders that add nodes one at a time (the gradient builder). Unknown where no rule applies.
std::vector<Shape> infer_node_shapes(const Graph& g, const Node& n);

}  // namespace torch_ort
