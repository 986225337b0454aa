// com.torch_ort::ATenOp and PythonOp, seen from the torch-free core. ATenOp: a node naming an
// ATen operator (attributes aten_op, arg_kinds, arg<i>; see
// torch_ort/ortmodule/export/translations/aten_op.py); PythonOp: a torch.autograd.Function by
// registry id. Both have PyTorch autograd as their backward, run by the ATenOpGrad kernel.
//
// For training, the forward node gains outputs that carry autograd's state into the saved set:
//   outputs [0, n)          the op's results (detached: what the rest of the graph reads)
//   outputs [n, 2n)         the same results with their autograd history (grad_fn)
//   outputs [2n, 2n + m)    per node input (m inputs): the leaf tensor autograd differentiates
//                           against (kNoValue for inputs that can never require grad)
// n is recorded as the attribute num_results. The kernel runs the op with grad mode on only when
// some leaf output is read, i.e. when the gradient rule asked for a gradient.
#pragma once

#include "csrc/core/ir/graph.h"
#include "csrc/core/ir/op_traits.h"

namespace torch_ort {

inline constexpr const char* kAtenOp = "ATenOp";
inline constexpr const char* kAtenOpGrad = "ATenOpGrad";
// A torch.autograd.Function run by registry id (csrc/runtime/python_op.h): the same outputs and
// the same ATenOpGrad backward, which makes autograd call the Function's own backward.
inline constexpr const char* kPythonOp = "PythonOp";

inline bool is_aten_op(const Node& n) { return n.domain == kOurDomain && n.op_type == kAtenOp; }
// Nodes whose backward is PyTorch autograd over results the forward recorded.
inline bool is_autograd_op(const Node& n) {
  return n.domain == kOurDomain && (n.op_type == kAtenOp || n.op_type == kPythonOp);
}
// Nodes of ours that run code we do not control (a user Function, the ATen dispatcher, PyTorch
// autograd): the opaque trait (ops/aten.cc).
inline bool runs_opaque_code(const Node& n) { return n.domain == kOurDomain && is_opaque(n); }

// Adds the autograd outputs described above to `n` (once; a no-op when num_results is set).
void request_aten_autograd_outputs(Graph& g, Node& n);

}  // namespace torch_ort
