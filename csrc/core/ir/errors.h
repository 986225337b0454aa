// Exceptions of the core. Each message names the problem: the op, the node, the value, the shape.
#pragma once

#include <stdexcept>
#include <string>

namespace torch_ort {

struct OnnxImportError : std::runtime_error { using std::runtime_error::runtime_error; };   // bad bytes / unsupported proto content
struct VerifyError : std::runtime_error { using std::runtime_error::runtime_error; };       // a broken IR invariant
struct GradientError : std::runtime_error { using std::runtime_error::runtime_error; };     // no rule / bad node for autodiff
struct UnsupportedOpError : std::runtime_error { using std::runtime_error::runtime_error; };  // no kernel for an op

}  // namespace torch_ort
