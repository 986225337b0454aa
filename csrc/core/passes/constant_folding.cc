// Constant folding at build time: Constant nodes become initializers, and the exporter's shape
// arithmetic over constants (Shape of fully known dims, Gather/Slice picking known dims of a
// Shape, Cast/CastLike, Sqrt, Add/Sub/Mul/Div, Concat, (Un)Squeeze, Reshape, Expand, Identity) is
// evaluated once here by the shared evaluator (eval/eval.h), its result an initializer rounded to
// its dtype; integer overflow does not fold. A node folds only when every input it reads
// the data of is a constant: nothing that depends on a graph input's data or on a parameter (a
// graph input) folds; a Shape or a CastLike's type input reads only metadata. Results are
// bounded (kMaxFoldedElements) so a fold never bakes a large tensor into the graph.
#include <algorithm>
#include <optional>
#include <unordered_map>

#include "csrc/core/eval/eval.h"
#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"

namespace torch_ort {
namespace {

using namespace pattern;

constexpr int64_t kMaxFoldedElements = 1024;   // largest result a fold may produce
constexpr int64_t kMaxInputElements = 1 << 16;  // larger constants are not read at all

// A small constant under evaluation: the evaluator's tensor (integers exact, floats as doubles
// already rounded to their dtype).
using Const = eval::Tensor;

bool supported(DType t) {
  return t == DType::kInt64 || t == DType::kInt32 || t == DType::kBool || is_floating(t);
}

std::optional<Const> from_data(const TensorData& t) {
  if (!supported(t.dtype) || t.numel() > kMaxInputElements) return std::nullopt;
  if (dtype_size(t.dtype) * t.numel() != static_cast<int64_t>(t.raw.size())) return std::nullopt;
  try {
    return eval::from_data(t);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

class ConstantFolding final : public Pass {
 public:
  std::string_view name() const override { return "constant_folding"; }

  bool run(Graph& g) override {
    const GraphIndex idx(g);
    known_.clear();
    for (const auto& [v, t] : g.initializers)
      if (auto c = from_data(t)) known_.emplace(v, std::move(*c));
    auto it = g.opset_imports.find("");
    opset_ = it == g.opset_imports.end() ? 20 : it->second;

    std::vector<char> drop(g.nodes.size(), 0);
    bool changed = false;
    for (NodeId i = 0; i < static_cast<NodeId>(g.nodes.size()); ++i) {
      const Node& n = g.nodes[i];
      if (!n.domain.empty() || n.outputs.size() != 1 || n.outputs[0] == kNoValue)
        continue;
      const ValueId out = n.outputs[0];
      if (is_graph_output(g, out)) continue;  // outputs stay produced by nodes
      if (is_constant(n)) {
        std::optional<TensorData> data;
        try {
          data = constant_node_data(n);
        } catch (const std::exception&) {
        }
        if (!data || (g.value(out).dtype != DType::kUndefined && g.value(out).dtype != data->dtype)) continue;
        if (auto c = from_data(*data)) known_[out] = std::move(*c);
        install(g, out, std::move(*data));
        drop[i] = changed = true;
        continue;
      }
      std::optional<Const> r;
      try {
        r = evaluate(g, idx, n);
      } catch (const std::exception&) {  // a malformed attribute: leave the node to the verifier
        r.reset();
      }
      if (!r || r->numel() > kMaxFoldedElements || !fits(g.value(out), *r)) continue;
      install(g, out, eval::to_data(*r));
      known_[out] = std::move(*r);
      drop[i] = changed = true;
    }
    erase_nodes(g, drop);
    return changed;
  }

 private:
  std::unordered_map<ValueId, Const> known_;  // values whose data is a (small) constant
  int64_t opset_ = 20;

  const Const* data(const Node& n, size_t i) const {
    if (!has_input(n, i)) return nullptr;
    auto it = known_.find(n.inputs[i]);
    return it == known_.end() ? nullptr : &it->second;
  }

  // The result agrees with what the graph says of the value (a disagreement is left to the verifier).
  static bool fits(const Value& v, const Const& r) {
    if (v.dtype != DType::kUndefined && v.dtype != r.dtype) return false;
    if (!v.shape.rank_known) return true;
    if (v.shape.dims.size() != r.shape.size()) return false;
    for (size_t k = 0; k < r.shape.size(); ++k)
      if (v.shape.dims[k].is_known() && v.shape.dims[k].value != r.shape[k]) return false;
    return true;
  }

  static void install(Graph& g, ValueId v, TensorData t) {
    Value& val = g.value(v);
    val.dtype = t.dtype;
    std::vector<Dim> dims;
    for (int64_t d : t.dims) dims.push_back(Dim::known(d));
    val.shape = Shape::of(std::move(dims));
    g.initializers[v] = std::move(t);
  }

  // The elements of a 1-D int64 value, each known or not: a constant, or the output of a Shape
  // node (a known dim is known even when its neighbours are symbolic).
  std::optional<std::vector<std::optional<int64_t>>> int_elements(const Graph& g, const GraphIndex& idx,
                                                                  const Node& n, size_t i) const {
    if (const Const* c = data(n, i)) {
      if (c->dtype != DType::kInt64 || c->shape.size() != 1) return std::nullopt;
      return std::vector<std::optional<int64_t>>(c->ints.begin(), c->ints.end());
    }
    const Node* p = has_input(n, i) ? producer(g, idx, n.inputs[i]) : nullptr;
    if (!p || !is_onnx(*p, "Shape") || !has_input(*p, 0)) return std::nullopt;
    const auto dims = shape_dims(g, *p);
    if (!dims) return std::nullopt;
    std::vector<std::optional<int64_t>> e;
    for (const Dim& d : *dims) e.push_back(d.is_known() ? std::optional<int64_t>(d.value) : std::nullopt);
    return e;
  }

  // Dims of Shape(x)[start:end] from x's static shape; nullopt when x's rank is unknown.
  static std::optional<std::vector<Dim>> shape_dims(const Graph& g, const Node& shape) {
    const Shape& s = g.value(shape.inputs[0]).shape;
    if (!s.rank_known) return std::nullopt;
    const auto [start, end] = eval::shape_range(shape.attrs, s.rank());
    return std::vector<Dim>(s.dims.begin() + start, s.dims.begin() + end);
  }

  static std::optional<Const> int64_vector(const std::vector<std::optional<int64_t>>& e, eval::Dims dims) {
    Const r{DType::kInt64, std::move(dims), {}, {}};
    for (const auto& x : e) {
      if (!x) return std::nullopt;  // a symbolic dim: known only at run time
      r.ints.push_back(*x);
    }
    return r;
  }

  // The node on data partly known (a Shape's output): the evaluator runs it on the positions
  // 0..len-1 of the elements, and the result is the elements at the positions it picked.
  std::optional<Const> on_positions(const Graph& g, const GraphIndex& idx, const Node& n) const {
    const auto e = int_elements(g, idx, n, 0);
    if (!e) return std::nullopt;
    const int64_t len = static_cast<int64_t>(e->size());
    std::vector<int64_t> pos(len);
    for (int64_t k = 0; k < len; ++k) pos[k] = k;
    const Const positions = Const::of_ints(DType::kInt64, {len}, std::move(pos));
    eval::Ins in{&positions};
    for (size_t k = 1; k < n.inputs.size(); ++k) {
      if (has_input(n, k) && !data(n, k)) return std::nullopt;
      in.push_back(data(n, k));
    }
    const Const r = eval::eval_node(n, in, {kMaxFoldedElements}).at(0);
    std::vector<std::optional<int64_t>> picked;
    for (int64_t k : r.ints) picked.push_back((*e)[k]);
    return int64_vector(picked, r.shape);
  }

  std::optional<Const> evaluate(const Graph& g, const GraphIndex& idx, const Node& n) const {
    const std::string& op = n.op_type;
    if (!eval::has_op(n.domain, op)) return std::nullopt;
    if (op == "Shape") {  // from the static shape: reads no data
      if (!has_input(n, 0)) return std::nullopt;
      const auto dims = shape_dims(g, n);
      if (!dims) return std::nullopt;
      std::vector<std::optional<int64_t>> e;
      for (const Dim& d : *dims) e.push_back(d.is_known() ? std::optional<int64_t>(d.value) : std::nullopt);
      return int64_vector(e, {static_cast<int64_t>(e.size())});
    }
    const bool positional = op == "Gather" || op == "Slice";  // may pick known dims of a Shape
    if (op == "Slice") {  // one (start, end, axis, step) each: opset < 10 (attribute form) is not emitted
      if (n.inputs.size() < 3) return std::nullopt;
      for (size_t k = 1; k < n.inputs.size(); ++k)
        if (has_input(n, k) && (!data(n, k) || data(n, k)->numel() != 1)) return std::nullopt;
    }
    if (positional && !data(n, 0)) {
      if (op == "Gather") {
        const int64_t axis = n.attrs.get_int("axis", 0);
        if (axis != 0 && axis != -1) return std::nullopt;
      }
      return on_positions(g, idx, n);
    }
    if (op == "Slice" && data(n, 0)->shape.size() != 1) return std::nullopt;  // the exporter slices Shape vectors
    if ((op == "Squeeze" || op == "Unsqueeze") && !axes_form_ok(n)) return std::nullopt;
    // CastLike reads only the dtype of input 1; the rest read the data of every present input.
    Const like;
    eval::Ins in;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      if (!has_input(n, k)) { in.push_back(nullptr); continue; }
      if (op == "CastLike" && k == 1) {
        like = Const{g.value(n.inputs[1]).dtype, {0}, {}, {}};  // its dtype, no data
        in.push_back(&like);
        continue;
      }
      if (!data(n, k)) return std::nullopt;
      in.push_back(data(n, k));
    }
    if (in.empty() || !in[0]) return std::nullopt;
    Const r = eval::eval_node(n, in, {kMaxFoldedElements}).at(0);
    if (!supported(r.dtype)) return std::nullopt;
    for (double& v : r.reals) v = eval::round_to_dtype(r.dtype, v);  // the runtime computes in the dtype
    return r;
  }

  // Squeeze/Unsqueeze take their axes from an attribute before opset 13 and from input 1 after:
  // a node mixing the forms is left to the verifier.
  bool axes_form_ok(const Node& n) const {
    if (opset_ >= 13) return !n.attrs.has("axes") && (n.op_type == "Squeeze" || has_input(n, 1));
    return !has_input(n, 1);
  }
};

}  // namespace

std::unique_ptr<Pass> make_constant_folding_pass() { return std::make_unique<ConstantFolding>(); }

}  // namespace torch_ort
