// Exceptions of the core. Each message names the problem: the op, the node, the value, the shape.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace torch_ort {

// A node the engine cannot take because of its op, and what the op lacks: "kernel",
// "gradient rule" (none registered) or "working gradient rule" (the rule failed on this node).
// Errors about ops carry these as data, so that callers (the ATen fallback) never parse messages.
struct UnsupportedNode {
  std::string node, domain, op_type, missing;
};

// A runtime_error that may name the nodes it is about (empty: not about particular ops).
struct NodesError : std::runtime_error {
  explicit NodesError(const std::string& what, std::vector<UnsupportedNode> nodes = {})
      : std::runtime_error(what), nodes(std::move(nodes)) {}
  std::vector<UnsupportedNode> nodes;
};

struct OnnxImportError : std::runtime_error { using std::runtime_error::runtime_error; };   // bad bytes / unsupported proto content
struct VerifyError : std::runtime_error { using std::runtime_error::runtime_error; };       // a broken IR invariant
// Shape inference proved a node's declared shape wrong, or a rule refused its inputs. Callers that
// can export again with fewer symbolic dims catch this one, never a VerifyError's text.
struct ShapeInferenceError : VerifyError { using VerifyError::VerifyError; };
struct GradientError : NodesError { using NodesError::NodesError; };        // no rule / bad node for autodiff
struct UnsupportedOpError : NodesError { using NodesError::NodesError; };   // no kernel for an op

}  // namespace torch_ort
