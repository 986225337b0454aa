// IR invariants: SSA (every value defined once), topological order, every node input defined
// before use, typed values, attribute kinds, each known op's input/output arity (op_arity.h),
// graph outputs defined. Throws VerifyError naming the node.
#pragma once

#include <string>

#include "csrc/core/ir/graph.h"

namespace torch_ort {

void verify(const Graph& g);

// "" when every attribute of n that the core or a kernel reads has the kind it is read as (axis
// an int, perm ints, epsilon a float, value a tensor, ...), else what is wrong, naming the
// attribute: "attribute 'axis' is of kind ints, expected int"; also a Cast whose `to` is absent or
// no element type we know. ATenOp/PythonOp arguments, whose kinds their own arg_kinds declare,
// are checked at the call. verify() and the importer run it, so a gradient rule, shape rule or
// pass never meets an attribute of the wrong kind.
std::string attribute_kind_problem(const Node& n);

// Reorders g.nodes topologically (stable: keeps the given order where it is already valid).
// Throws VerifyError naming a node on the cycle when there is one.
void topological_sort(Graph& g);

}  // namespace torch_ort
