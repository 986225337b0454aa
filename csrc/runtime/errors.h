// Exceptions of the runtime (the core's own live in csrc/core/ir/errors.h). Bindings map each
// to a Python class; every message names the input, the op or the node it is about.
#pragma once

#include <stdexcept>
#include <string>

namespace torch_ort {

// A forward input (or an incoming gradient) disagrees with the graph: count, dtype, rank, size.
// Bindings raise it as TypeError, because it is the caller passing the wrong thing.
struct InputMismatchError : std::runtime_error { using std::runtime_error::runtime_error; };

// A kernel failed while running: wraps the ATen message with the op and node.
struct KernelError : std::runtime_error { using std::runtime_error::runtime_error; };

// A decision the export took from the values it saw (a Python `if` on a tensor's value) does not
// hold for this call's values: the graph is the other branch's, and its outputs are not returned.
// ORTModule exports again (torch_ort/ortmodule/export/decisions.py).
struct DecisionChangedError : KernelError { using KernelError::KernelError; };

// The engine was driven wrongly: backward twice on one run context, a context of another engine.
struct RunContextError : std::runtime_error { using std::runtime_error::runtime_error; };

}  // namespace torch_ort
