// IR invariants: SSA (every value defined once), topological order, every node input defined
// before use, typed values, graph outputs defined. Throws VerifyError naming the node.
#pragma once

#include "csrc/core/ir/graph.h"

namespace torch_ort {

void verify(const Graph& g);

// Reorders g.nodes topologically (stable: keeps the given order where it is already valid).
// Throws VerifyError naming a node on the cycle when there is one.
void topological_sort(Graph& g);

}  // namespace torch_ort
