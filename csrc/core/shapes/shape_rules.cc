// The shape-rule registry, the context rules read and write, and helpers shared by the rules
// of the family files (csrc/core/ops/<family>.cc).
#include "csrc/core/shapes/shape_rules.h"

#include <stdexcept>

#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/limits.h"

namespace torch_ort {
namespace {

constexpr int64_t kMaxValues = 64;  // int tensors larger than this are data, not shapes

}  // namespace

ShapeCtx::ShapeCtx(const Graph& g, const Node& node,
                   const std::unordered_map<ValueId, SymValues>* values)
    : out_shapes(node.outputs.size()),
      out_values(node.outputs.size()),
      g_(g),
      node_(node),
      values_(values) {}

int64_t ShapeCtx::opset() const {
  auto it = g_.opset_imports.find(node_.domain);
  return it == g_.opset_imports.end() ? (node_.domain.empty() ? 20 : 1) : it->second;
}

Shape ShapeCtx::in(int i) const {
  if (!has_in(i)) return Shape::unknown();
  Shape s = g_.value(node_.inputs[i]).shape;
  for (Dim& d : s.dims) d = canonical(d);
  return s;
}

DType ShapeCtx::dtype(int i) const {
  return has_in(i) ? g_.value(node_.inputs[i]).dtype : DType::kUndefined;
}

const SymValues* ShapeCtx::values(int i) const {
  if (!has_in(i)) return nullptr;
  const ValueId v = node_.inputs[i];
  if (values_) {
    auto it = values_->find(v);
    if (it != values_->end()) return &it->second;
  }
  if (auto it = from_initializers_.find(i); it != from_initializers_.end()) return &it->second;
  auto init = g_.initializers.find(v);
  if (init == g_.initializers.end() || init->second.numel() > kMaxValues) return nullptr;
  if (init->second.dtype != DType::kInt64 && init->second.dtype != DType::kInt32) return nullptr;
  SymValues out;
  for (int64_t x : init->second.as_int64s()) out.push_back(SymExpr::constant(x));
  return &(from_initializers_[i] = std::move(out));
}

std::optional<std::vector<int64_t>> ShapeCtx::ints(int i) const {
  const SymValues* v = values(i);
  if (!v) return std::nullopt;
  std::vector<int64_t> out;
  for (const SymInt& x : *v) {
    if (!x || !x->is_constant()) return std::nullopt;
    out.push_back(x->constant_value());
  }
  return out;
}

void ShapeCtx::set(int k, Shape s) {
  if (k < 0 || k >= num_outputs()) return;  // an omitted output's shape is simply not read
  // A shape computed from the model's constants (Expand, Tile, Range, Reshape targets) must be
  // within the limits a model's own shapes are held to: nothing later may allocate by it.
  if (std::string why = limits::check_shape(s); !why.empty())
    fail("output " + std::to_string(k) + " would have " +
         (s.rank() <= limits::kMaxRank ? "shape " + s.to_string() + ": " : std::string()) + why);
  out_shapes[k] = std::move(s);
}

void ShapeCtx::set_values(int k, SymValues v, bool scalar) {
  if (k < 0 || k >= num_outputs()) return;
  set(k, scalar ? Shape::of({}) : Shape::of({Dim::known(static_cast<int64_t>(v.size()))}));
  if (static_cast<int64_t>(v.size()) <= kMaxValues) out_values[k] = std::move(v);
}

void ShapeCtx::fail(const std::string& why) const {
  throw ShapeInferenceError("shape inference: " + node_.describe() + ": " + why);
}

ShapeRegistry& ShapeRegistry::instance() {
  static ShapeRegistry r;  // function-local: safe under any static-init order
  return r;
}

void same_as_input0(ShapeCtx& c) { c.set(0, c.in(0)); }

void identity_shape(ShapeCtx& c) {
  c.set(0, c.in(0));
  if (const SymValues* v = c.values(0)) c.set_values(0, *v, c.rank(0) == 0);
}

void declared_by_gradient_builder(ShapeCtx&) {}

Shape broadcast(const ShapeCtx& c, const Shape& a, const Shape& b) {
  if (!a.rank_known || !b.rank_known) return Shape::unknown();
  const size_t n = std::max(a.dims.size(), b.dims.size());
  std::vector<Dim> out(n);
  for (size_t k = 0; k < n; ++k) {
    const Dim* x = k < a.dims.size() ? &a.dims[a.dims.size() - 1 - k] : nullptr;
    const Dim* y = k < b.dims.size() ? &b.dims[b.dims.size() - 1 - k] : nullptr;
    Dim& d = out[n - 1 - k];
    if (!x) d = *y;
    else if (!y) d = *x;
    else if (x->is_known() && x->value == 1) d = *y;
    else if (y->is_known() && y->value == 1) d = *x;
    else if (x->same_as(*y)) d = *x;
    else if (x->is_known() && y->is_known())
      c.fail("cannot broadcast " + a.to_string() + " with " + b.to_string());
    // A size > 1 wins over a symbol: the symbol is either equal to it or 1.
    else if (x->is_known()) d = *x;
    else if (y->is_known()) d = *y;
    else d = Dim{};  // two different symbols, or an unknown: either may be 1
  }
  return Shape::of(std::move(out));
}

int64_t norm_axis(const ShapeCtx& c, int64_t axis, int64_t rank) {
  const int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    c.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return a;
}

Shape unknown_dims(int64_t rank) {
  // Callers pass a rank they hold (<= kMaxRank); never allocate by a larger count.
  if (rank > limits::kMaxRank) throw std::length_error("unknown_dims: rank " + std::to_string(rank));
  return rank < 0 ? Shape::unknown() : Shape::of(std::vector<Dim>(rank));
}

Shape shape_from_values(const ShapeCtx& c, int i) {
  if (const SymValues* v = c.values(i)) {
    Shape s = Shape::of({});
    for (const SymInt& x : *v) s.dims.push_back(x ? x->to_dim() : Dim{});
    return s;
  }
  const Shape len = c.in(i);
  if (len.rank() == 1 && len.dims[0].is_known()) {
    // The length of a shape vector is the output's rank: bounded before anything is sized by it.
    if (len.dims[0].value > limits::kMaxRank)
      c.fail("input " + std::to_string(i) + " is a shape of rank " +
             limits::over(len.dims[0].value, "kMaxRank", limits::kMaxRank));
    return unknown_dims(len.dims[0].value);
  }
  return Shape::unknown();
}

ShapeCtx run_shape_rule(const Graph& g, const Node& node,
                        const std::unordered_map<ValueId, SymValues>* values) {
  ShapeCtx c(g, node, values);
  ShapeRule rule = ShapeRegistry::instance().find(node.domain, node.op_type);
  if (!rule) return c;
  try {
    rule(c);
  } catch (const VerifyError&) {
    throw;
  } catch (const std::exception&) {
    // A malformed attribute or constant: the kernel will say so; inference just gives up.
    c.out_shapes.assign(node.outputs.size(), Shape::unknown());
    c.out_values.assign(node.outputs.size(), std::nullopt);
  }
  return c;
}

}  // namespace torch_ort
