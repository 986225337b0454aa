// elementwise_chain_fusion: a tree of single-consumer fp32 elementwise ops (Add, Mul, Tanh, ...)
// becomes one com.torch_ort::FusedElementwise node whose kernel runs the whole tree tile by tile,
// intermediates in a per-thread tile buffer, so memory is read and written once.
//
// The program travels as attributes (see fused_elementwise.h for the kernel side):
//   ops      : strings, one instruction each, in execution order ("Mul", "Tanh", ...)
//   operands : ints, two per instruction: o in [0, n_inputs) is node input o, o >= n_inputs is
//              the result of instruction o - n_inputs, o < 0 is constant -(o + 1); the second
//              operand of a unary op is 0 and unread
//   consts   : floats, the scalar constants folded into the program
// The node's one output is the last instruction's result.
//
// Every operand is the root's shape ("full"), a last-dim row (bias) or a scalar: any such tree
// is correct per element under broadcasting, and the backward kernel reduces broadcast inputs'
// gradients to their shapes.
#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "csrc/core/ir/op_traits.h"
#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"
#include "csrc/core/passes/rewrite.h"

namespace torch_ort {
namespace {

using pattern::is_onnx;

constexpr size_t kMaxInstructions = 32;  // one tile buffer each, per thread
constexpr size_t kMaxInputs = 16;

std::optional<double> scalar_const(const Graph& g, const GraphIndex& idx, ValueId v) {
  std::optional<TensorData> t = pattern::constant_of(g, idx, v);
  if (!t || t->numel() != 1) return std::nullopt;
  try {
    return t->as_doubles().at(0);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// Does a value of shape s broadcast per element into the root's shape r: the same shape, a
// last-dim row (leading dims 1), or a scalar (all dims 1)?
bool fits(const Shape& s, const Shape& r) {
  if (!s.rank_known || !r.rank_known || s.rank() > r.rank()) return false;
  if (s.same_as(r)) return true;
  for (int64_t i = 0; i + 1 < s.rank(); ++i)
    if (!(s.dims[i].is_known() && s.dims[i].value == 1)) return false;
  if (s.rank() == 0) return true;
  const Dim& last = s.dims.back();
  return (last.is_known() && last.value == 1) || (r.rank() > 0 && last.same_as(r.dims.back()));
}

// An fp32 elementwise op the program can run whose operands all fit the root's shape.
bool eligible(const Graph& g, const GraphIndex& idx, const Node& node, const Node& root) {
  const Shape& r = g.value(root.outputs[0]).shape;
  const FusedInstr instr = op_traits(node).fused;  // (ops/elementwise.cc)
  if (instr == FusedInstr::kNone) return false;
  const bool unary = instr == FusedInstr::kUnary;
  if (node.inputs.size() != (unary ? 1u : 2u) || node.outputs.size() != 1) return false;
  const ValueId out = node.outputs[0];
  if (out == kNoValue || g.value(out).dtype != DType::kFloat || !fits(g.value(out).shape, r)) return false;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const ValueId v = node.inputs[i];
    if (v == kNoValue) return false;
    const bool is_const = scalar_const(g, idx, v).has_value();
    if (node.op_type == "Pow" && i == 1) {
      if (!is_const) return false;  // only a constant exponent: x^p has a simple derivative
      continue;
    }
    if (is_const) continue;
    if (g.value(v).dtype != DType::kFloat || !fits(g.value(v).shape, r)) return false;
  }
  return true;
}

// The tree's program as the FusedElementwise node that replaces its root, or nullopt for a tree
// of one node or with more inputs than the kernel takes.
std::optional<Node> program(const Graph& g, const rewrite::Match& m, const Node& root_node) {
  if (m.interior().empty()) return std::nullopt;
  std::vector<NodeId> c = m.interior();
  c.push_back(m.node("root"));
  std::sort(c.begin(), c.end());  // topological order; the root (largest id) last
  std::map<ValueId, int64_t> result_of;  // value -> instruction index
  for (size_t k = 0; k < c.size(); ++k) result_of[g.nodes[c[k]].outputs[0]] = static_cast<int64_t>(k);
  std::vector<ValueId> inputs;
  std::vector<float> consts;
  std::vector<std::string> ops;
  std::vector<int64_t> raw;  // operands before the input count is final: inputs as kInputTag + i
  constexpr int64_t kInputTag = 1 << 20;
  for (NodeId n : c) {
    const Node& node = g.nodes[n];
    ops.push_back(node.op_type);
    for (size_t i = 0; i < 2; ++i) {
      if (i >= node.inputs.size()) {
        raw.push_back(kInputTag * 2);  // unread second operand of a unary op
        continue;
      }
      const ValueId v = node.inputs[i];
      if (auto it = result_of.find(v); it != result_of.end()) {
        raw.push_back(it->second);
      } else if (std::optional<double> s = scalar_const(g, m.index(), v)) {
        consts.push_back(static_cast<float>(*s));
        raw.push_back(-static_cast<int64_t>(consts.size()));
      } else {
        auto at = std::find(inputs.begin(), inputs.end(), v);
        if (at == inputs.end()) at = inputs.insert(inputs.end(), v);
        raw.push_back(kInputTag + (at - inputs.begin()));
      }
    }
  }
  if (inputs.size() > kMaxInputs || inputs.empty()) return std::nullopt;
  const int64_t n_in = static_cast<int64_t>(inputs.size());
  std::vector<int64_t> operands;
  for (int64_t o : raw) {
    if (o == kInputTag * 2) operands.push_back(0);
    else if (o >= kInputTag) operands.push_back(o - kInputTag);
    else if (o >= 0) operands.push_back(o + n_in);
    else operands.push_back(o);
  }
  Attributes a;
  a.set("ops", ops);
  a.set("operands", operands);
  if (!consts.empty()) a.set("consts", consts);  // absent = none (an empty list has no ONNX type)
  // The root's name and output are kept.
  return Node{kOurDomain, "FusedElementwise", root_node.name, std::move(inputs), root_node.outputs, std::move(a)};
}

class ElementwiseChainFusion final : public Pass {
 public:
  std::string_view name() const override { return "elementwise_chain_fusion"; }

  bool run(Graph& g) override {
    using namespace rewrite;
    const GraphIndex idx(g);
    auto member = [&idx](const Graph& gg, const Node& n, const Node& root) {
      return root.outputs.size() == 1 && root.outputs[0] != kNoValue && eligible(gg, idx, n, root);
    };
    const Rule rule{"a tree of fp32 elementwise ops -> FusedElementwise", tree(member, kMaxInstructions).as("root"),
                    [](const Graph& gg, const Match& m) { return program(gg, m, gg.nodes[m.node("root")]).has_value(); },
                    [](Graph& gg, const Match& m, const Node& root) { return *program(gg, m, root); }};
    // From the last node: each tree is the largest one ending at its root.
    return rewrite::apply(g, {rule}, Scan::kLastToFirst);
  }
};

}  // namespace

std::unique_ptr<Pass> make_elementwise_chain_fusion_pass() { return std::make_unique<ElementwiseChainFusion>(); }

}  // namespace torch_ort
