// The small vocabulary gradient rules are written in: input i, output i, grad of output i,
// attributes, and builders that append nodes to the backward graph.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "csrc/core/ir/graph.h"

namespace torch_ort {

// What the gradient builder shares across all rules while it builds one training graph.
struct BuilderState {
  explicit BuilderState(Graph& graph) : g(graph) {}
  Graph& g;                              // the training graph (values are added here)
  std::vector<Node> backward;            // emitted backward nodes, in execution order
  std::vector<Node> forward_side;        // emitted nodes that run at the end of forward (Shape)
  std::map<ValueId, ValueId> shape_of;   // forward value -> its Shape value (one per value)
};

class GradCtx {
 public:
  // Built by the gradient builder for one forward node (a copy: g.nodes may grow meanwhile).
  GradCtx(BuilderState& state, Node node, std::vector<ValueId> grad_outputs, std::vector<bool> needs);

  // --- what the rule reads
  const Node& node() const { return node_; }
  ValueId in(int i) const;             // forward input i (throws if absent)
  bool has_in(int i) const;            // present (optional inputs may be omitted)
  ValueId out(int i) const;            // forward output i
  ValueId grad_out(int i) const;       // incoming gradient of output i, kNoValue if none flows
  bool has_grad_out(int i) const { return grad_out(i) != kNoValue; }
  bool needs(int i) const;             // does input i need a gradient?
  const Attributes& attrs() const { return node_.attrs; }
  const Value& info(ValueId v) const { return g_.value(v); }
  int64_t rank(ValueId v) const;       // throws (naming the node) when the rank is unknown
  // Constant int64 values of an input that must be constant (axes, shape): initializer or Constant.
  std::vector<int64_t> const_ints(int i) const;
  bool is_const(int i) const;
  int64_t opset() const;               // the default-domain opset the graph was exported with

  // --- what the rule writes
  void set_grad(int i, ValueId grad);  // gradient of input i (ignored when !needs(i))

  // --- builders (each appends one node to the backward graph and returns its output)
  ValueId op(const std::string& op_type, std::vector<ValueId> inputs, Attributes attrs = {},
             DType dtype = DType::kUndefined /* = dtype of inputs[0] */, Shape shape = {},
             const std::string& domain = "");
  ValueId ours(const std::string& op_type, std::vector<ValueId> inputs, Attributes attrs = {},
               DType dtype = DType::kUndefined, Shape shape = {}) {
    return op(op_type, std::move(inputs), std::move(attrs), dtype, std::move(shape), kOurDomain);
  }
  // One node of our domain with one output per `like` value, typed as it (dX_i like X_i);
  // kNoValue in `like` omits that output (ConcatGrad: only the inputs that need a gradient).
  std::vector<ValueId> ours_multi(const std::string& op_type, std::vector<ValueId> inputs,
                                  const std::vector<ValueId>& like, Attributes attrs = {});
  ValueId add(ValueId a, ValueId b) { return op("Add", {a, b}); }
  ValueId sub(ValueId a, ValueId b) { return op("Sub", {a, b}); }
  ValueId mul(ValueId a, ValueId b) { return op("Mul", {a, b}); }
  ValueId div(ValueId a, ValueId b) { return op("Div", {a, b}); }
  ValueId neg(ValueId a) { return op("Neg", {a}); }
  ValueId matmul(ValueId a, ValueId b) { return op("MatMul", {a, b}); }
  ValueId transpose(ValueId a, std::vector<int64_t> perm);
  ValueId transpose_last2(ValueId a);  // swap the two innermost dims (rank must be known)
  ValueId const_ints(const std::vector<int64_t>& v, bool scalar = false);  // int64 initializer
  ValueId const_scalar(double v, DType dtype);                              // float initializer
  // Shape(x), evaluated in the forward pass so that backward keeps a tiny int64 tensor instead
  // of x itself.
  ValueId shape_of(ValueId x);
  // Sums a broadcast gradient down to the shape of `like` (numpy broadcasting rules); no node
  // at all when the shapes are provably equal.
  ValueId sum_to_shape_of(ValueId grad, ValueId like);

 private:
  BuilderState& state_;
  Graph& g_;
  Node node_;
  std::vector<ValueId> grad_outputs_;
  std::vector<bool> needs_;

 public:
  std::map<int, ValueId> grads;  // set_grad results, read by the builder
};

}  // namespace torch_ort
