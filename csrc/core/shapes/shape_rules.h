// Shape inference rules: one per op, registered with one line in the op's family file,
// csrc/core/ops/<family>.cc (next to its traits line and its gradient rule).
//
//   REGISTER_SHAPE_RULE("MatMul", matmul_shape);
//   REGISTER_SHAPE_RULE_IN(kOurDomain, "ReluGrad", activation_grad_shape);
// A rule reads input shapes, attributes and the *values* of small integer inputs (shape vectors,
// axes, sizes; each element a symbolic integer, so Shape(x) of [batch, 8] has values [batch, 8]),
// and sets output shapes and, for integer outputs, their values. An op without a rule (or a rule
// that cannot tell) leaves its outputs unknown; only a provable contradiction is an error.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "csrc/core/ir/graph.h"
#include "csrc/core/ir/op_registry.h"
#include "csrc/core/shapes/sym_dim.h"

namespace torch_ort {

// Elements of a small int tensor, row-major: each a (symbolic) integer, or nullopt if unknown.
// Not Dims: a Reshape target holds -1, a Slice holds negative starts.
using SymInt = std::optional<SymExpr>;
using SymValues = std::vector<SymInt>;

class ShapeCtx {
 public:
  // `values` maps a value to its known elements (nullptr: only initializers are consulted).
  ShapeCtx(const Graph& g, const Node& node, const std::unordered_map<ValueId, SymValues>* values);

  const Node& node() const { return node_; }
  const Attributes& attrs() const { return node_.attrs; }
  int64_t opset() const;  // of the node's domain
  int num_inputs() const { return static_cast<int>(node_.inputs.size()); }
  int num_outputs() const { return static_cast<int>(node_.outputs.size()); }
  bool has_in(int i) const { return i >= 0 && i < num_inputs() && node_.inputs[i] != kNoValue; }
  // Input i's shape with canonical dims; unknown for an absent input.
  Shape in(int i) const;
  int64_t rank(int i) const { return in(i).rank(); }  // -1 when unknown
  DType dtype(int i) const;
  // Elements of input i when they are known (an int tensor from a constant or a shape chain).
  const SymValues* values(int i) const;
  // Elements of input i when every one is a known integer.
  std::optional<std::vector<int64_t>> ints(int i) const;

  void set(int k, Shape s);                // output k's shape (ignored past the last output)
  void set_values(int k, SymValues v, bool scalar = false);  // also sets the shape [n] or []
  [[noreturn]] void fail(const std::string& why) const;  // VerifyError naming the node

  std::vector<Shape> out_shapes;                    // per output; unknown unless set
  std::vector<std::optional<SymValues>> out_values;  // per output

 private:
  const Graph& g_;
  const Node& node_;
  const std::unordered_map<ValueId, SymValues>* values_;
  mutable std::map<int, SymValues> from_initializers_;
};

using ShapeRule = void (*)(ShapeCtx&);

class ShapeRegistry : public OpRegistry<ShapeRule> {
 public:
  static ShapeRegistry& instance();
  ShapeRule find(const std::string& domain, const std::string& op) const {  // nullptr if none
    const ShapeRule* rule = entry(domain, op);
    return rule ? *rule : nullptr;
  }

 private:
  ShapeRegistry() : OpRegistry("shape rule") {}
};

#define TORCH_ORT_SHAPE_CONCAT_INNER(a, b) a##b
#define TORCH_ORT_SHAPE_CONCAT(a, b) TORCH_ORT_SHAPE_CONCAT_INNER(a, b)
#define REGISTER_SHAPE_RULE_IN(domain, op, fn)                                 \
  static const bool TORCH_ORT_SHAPE_CONCAT(kShapeReg_, __COUNTER__) =         \
      ::torch_ort::ShapeRegistry::instance().add(domain, op, fn)
#define REGISTER_SHAPE_RULE(op, fn) REGISTER_SHAPE_RULE_IN("", op, fn)

// Rules many ops share. Output 0 has input 0's shape (elementwise unary ops and the like).
void same_as_input0(ShapeCtx& c);
// The same, passing the values of a shape computation through too (Identity, ToHost, ToDevice).
void identity_shape(ShapeCtx& c);
// Our gradient ops whose output shapes the gradient builder declares when it emits them: a
// gradient has the shape of the input it differentiates (GradCtx::set_grad, ours_multi's `like`
// values), so there is nothing to infer, only the declaration to keep. The run-time check
// (Engine.check_shapes, tests/python/test_shapes.py) holds those declarations to the real tensors.
void declared_by_gradient_builder(ShapeCtx& c);

// --- helpers shared by the rules of the family files (csrc/core/ops/<family>.cc)
// Numpy broadcasting of two shapes; fails (naming the node) on two different known sizes
// neither of which is 1. Unknown rank in -> unknown out.
Shape broadcast(const ShapeCtx& c, const Shape& a, const Shape& b);
// Normalizes a possibly negative axis against `rank`; fails when out of range.
int64_t norm_axis(const ShapeCtx& c, int64_t axis, int64_t rank);
// A shape of `rank` unknown dims (rank >= 0), for "the rank is all we know".
Shape unknown_dims(int64_t rank);
// Output shape from the values of a shape input (Expand, ConstantOfShape, SumToShape): the
// values if known, else the rank from the input's length, else unknown.
Shape shape_from_values(const ShapeCtx& c, int i);

// Runs the rule of one node (no graph changes). Output shapes are unknown for ops without a rule;
// exceptions other than VerifyError (a malformed attribute) also mean "unknown".
ShapeCtx run_shape_rule(const Graph& g, const Node& node,
                        const std::unordered_map<ValueId, SymValues>* values);

}  // namespace torch_ort
