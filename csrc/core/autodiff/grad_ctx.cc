// The rule-writing vocabulary: reading a forward node, emitting backward nodes.
#include "csrc/core/autodiff/grad_ctx.h"

#include <algorithm>
#include <numeric>

#include "csrc/core/ir/errors.h"
#include "csrc/core/shapes/infer_shapes.h"

namespace torch_ort {

GradCtx::GradCtx(BuilderState& state, Node node, std::vector<ValueId> grad_outputs,
                 std::vector<bool> needs)
    : state_(state), g_(state.g), node_(std::move(node)), grad_outputs_(std::move(grad_outputs)),
      needs_(std::move(needs)) {}

bool GradCtx::has_in(int i) const {
  return i >= 0 && i < static_cast<int>(node_.inputs.size()) && node_.inputs[i] != kNoValue;
}

ValueId GradCtx::in(int i) const {
  if (!has_in(i))
    throw GradientError(node_.describe() + ": gradient rule reads input " + std::to_string(i) +
                        ", which is absent");
  return node_.inputs[i];
}

ValueId GradCtx::out(int i) const {
  if (i < 0 || i >= static_cast<int>(node_.outputs.size()) || node_.outputs[i] == kNoValue)
    throw GradientError(node_.describe() + ": gradient rule reads output " + std::to_string(i) +
                        ", which is absent");
  return node_.outputs[i];
}

ValueId GradCtx::grad_out(int i) const {
  return i >= 0 && i < static_cast<int>(grad_outputs_.size()) ? grad_outputs_[i] : kNoValue;
}

bool GradCtx::needs(int i) const {
  return i >= 0 && i < static_cast<int>(needs_.size()) && needs_[i];
}

int64_t GradCtx::rank(ValueId v) const {
  const Value& val = g_.value(v);
  if (!val.shape.rank_known)
    throw GradientError(node_.describe() + ": the gradient needs the rank of '" + val.name +
                        "', which is unknown");
  return val.shape.rank();
}

bool GradCtx::is_const(int i) const {
  if (!has_in(i)) return false;
  ValueId v = node_.inputs[i];
  if (g_.initializers.count(v)) return true;
  GraphIndex idx(g_);
  NodeId p = idx.producer[v];
  return p >= 0 && is_constant(g_.nodes[p]);
}

int64_t GradCtx::opset() const {
  auto it = g_.opset_imports.find("");
  return it == g_.opset_imports.end() ? 20 : it->second;
}

std::vector<int64_t> GradCtx::const_ints(int i) const {
  ValueId v = in(i);
  if (auto it = g_.initializers.find(v); it != g_.initializers.end()) return it->second.as_int64s();
  for (const Node& n : g_.nodes) {
    if (!is_constant(n) || n.outputs.empty() || n.outputs[0] != v) continue;
    if (const TensorData* t = n.attrs.get_tensor("value")) return t->as_int64s();
    if (n.attrs.has("value_ints")) return n.attrs.get_ints("value_ints", {});
    if (n.attrs.has("value_int")) return {n.attrs.get_int("value_int", 0)};
  }
  throw GradientError(node_.describe() + ": input " + std::to_string(i) + " ('" +
                      g_.value(v).name + "') must be a constant for the gradient");
}

void GradCtx::set_grad(int i, ValueId grad) {
  if (!needs(i) || grad == kNoValue) return;
  // A gradient has its input's shape by contract; record it where the builder could not infer it.
  Value& gv = g_.value(grad);
  if (!gv.shape.rank_known) gv.shape = g_.value(in(i)).shape;
  grads[i] = grad;
}

ValueId GradCtx::op(const std::string& op_type, std::vector<ValueId> inputs, Attributes attrs,
                    DType dtype, Shape shape, const std::string& domain) {
  if (dtype == DType::kUndefined) {
    // A rule takes the dtype from its first operand, e.g. grad_out(0): absent when a malformed node
    // gets gradients on other outputs only.
    if (inputs.empty() || inputs[0] == kNoValue)
      throw GradientError(node_.describe() + ": the gradient's " + op_type +
                          " has no first operand to take its dtype from");
    dtype = g_.value(inputs[0]).dtype;
  }
  const std::string base = node_.name.empty() ? node_.op_type : node_.name;
  Node n{domain, op_type, g_.unique_node_name(base + "_grad/" + op_type), std::move(inputs), {kNoValue},
         std::move(attrs)};
  // The shape table knows every op we emit; provable shapes let sum_to_shape_of skip SumToShape.
  if (!shape.rank_known) shape = infer_node_shapes(g_, n).at(0);
  const ValueId out = g_.new_value(base + "_grad/" + op_type, dtype, std::move(shape));
  n.outputs[0] = out;
  state_.backward.push_back(std::move(n));
  return out;
}

std::vector<ValueId> GradCtx::ours_multi(const std::string& op_type, std::vector<ValueId> inputs,
                                         const std::vector<ValueId>& like, Attributes attrs) {
  const std::string base = node_.name.empty() ? node_.op_type : node_.name;
  std::vector<ValueId> outs;
  for (ValueId l : like) {
    if (l == kNoValue) { outs.push_back(kNoValue); continue; }
    const Value lv = g_.value(l);  // a copy: new_value may grow the value table
    outs.push_back(g_.new_value(base + "_grad/" + op_type, lv.dtype, lv.shape));
  }
  state_.backward.push_back(Node{kOurDomain, op_type, g_.unique_node_name(base + "_grad/" + op_type),
                                 std::move(inputs), outs, std::move(attrs)});
  return outs;
}

ValueId GradCtx::transpose(ValueId a, std::vector<int64_t> perm) {
  Attributes at;
  at.set("perm", perm);
  Shape s;
  const Shape& in_shape = g_.value(a).shape;
  if (in_shape.rank_known && static_cast<size_t>(in_shape.rank()) == perm.size()) {
    s = Shape::of({});
    for (int64_t p : perm) s.dims.push_back(in_shape.dims[p]);
  }
  return op("Transpose", {a}, std::move(at), DType::kUndefined, std::move(s));
}

ValueId GradCtx::transpose_last2(ValueId a) {
  std::vector<int64_t> perm(rank(a));
  std::iota(perm.begin(), perm.end(), 0);
  if (perm.size() < 2)
    throw GradientError(node_.describe() + ": transpose of a rank-" + std::to_string(perm.size()) +
                        " value in the gradient");
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return transpose(a, std::move(perm));
}

ValueId GradCtx::const_ints(const std::vector<int64_t>& v, bool scalar) {
  TensorData t = TensorData::from_int64s(v, scalar);
  Shape s = Shape::of({});
  for (int64_t d : t.dims) s.dims.push_back(Dim::known(d));
  ValueId id = g_.new_value(node_.name + "_grad/const", DType::kInt64, s);
  g_.initializers[id] = std::move(t);
  return id;
}

ValueId GradCtx::const_scalar(double v, DType dtype) {
  ValueId id = g_.new_value(node_.name + "_grad/scalar", dtype, Shape::of({}));
  g_.initializers[id] = TensorData::scalar_float(dtype, v);
  return id;
}

ValueId GradCtx::shape_of(ValueId x) {
  if (auto it = state_.shape_of.find(x); it != state_.shape_of.end()) return it->second;
  const Shape& xs = g_.value(x).shape;
  Shape s = xs.rank_known ? Shape::of({Dim::known(xs.rank())}) : Shape::of({Dim{}});
  ValueId out = g_.new_value(g_.value(x).name + "/shape", DType::kInt64, std::move(s));
  state_.forward_side.push_back(
      Node{"", "Shape", g_.unique_node_name(g_.value(x).name + "/Shape"), {x}, {out}, {}});
  state_.shape_of[x] = out;
  return out;
}

ValueId GradCtx::sum_to_shape_of(ValueId grad, ValueId like) {
  const Shape target = g_.value(like).shape;
  if (g_.value(grad).shape.same_as(target)) return grad;
  // A fully known target (a bias, a weight) needs no Shape node: its sizes are a constant.
  bool all_known = target.rank_known;
  std::vector<int64_t> sizes;
  for (const Dim& d : target.dims) {
    all_known &= d.is_known();
    sizes.push_back(d.value);
  }
  const ValueId shape = all_known ? const_ints(sizes) : shape_of(like);
  return ours("SumToShape", {grad, shape}, {}, DType::kUndefined, target);
}

}  // namespace torch_ort
