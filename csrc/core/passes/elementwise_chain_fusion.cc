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

class ElementwiseChainFusion final : public Pass {
 public:
  std::string_view name() const override { return "elementwise_chain_fusion"; }

  bool run(Graph& g) override {
    const GraphIndex idx(g);
    std::vector<int> cluster_of(g.nodes.size(), -1);
    std::vector<std::vector<NodeId>> clusters;
    for (NodeId root = static_cast<NodeId>(g.nodes.size()) - 1; root >= 0; --root) {
      if (cluster_of[root] >= 0 || g.nodes[root].outputs.size() != 1 || g.nodes[root].outputs[0] == kNoValue)
        continue;
      const Shape r = g.value(g.nodes[root].outputs[0]).shape;
      if (!eligible(g, idx, root, r)) continue;
      std::vector<NodeId> members{root};
      cluster_of[root] = static_cast<int>(clusters.size());
      // Grow towards the inputs through values only this cluster reads.
      for (size_t k = 0; k < members.size() && members.size() < kMaxInstructions; ++k) {
        for (ValueId v : g.nodes[members[k]].inputs) {
          const NodeId p = v == kNoValue ? -1 : idx.producer[v];
          if (p < 0 || cluster_of[p] >= 0 || members.size() >= kMaxInstructions) continue;
          if (idx.consumers[v].size() != 1 || pattern::is_graph_output(g, v)) continue;
          if (!fits(g.value(v).shape, r) || !eligible(g, idx, p, r)) continue;
          cluster_of[p] = cluster_of[root];
          members.push_back(p);
        }
      }
      clusters.push_back(std::move(members));
    }

    std::vector<char> drop(g.nodes.size(), 0);
    bool changed = false;
    for (std::vector<NodeId>& c : clusters) {
      if (c.size() < 2) continue;
      std::sort(c.begin(), c.end());  // topological order; the root (largest id) last
      if (fuse(g, idx, c, drop)) changed = true;
    }
    pattern::erase_nodes(g, drop);
    return changed;
  }

 private:
  // An fp32 elementwise op the program can run whose operands all fit the root shape r.
  static bool eligible(const Graph& g, const GraphIndex& idx, NodeId n, const Shape& r) {
    const Node& node = g.nodes[n];
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

  static bool fuse(Graph& g, const GraphIndex& idx, const std::vector<NodeId>& c, std::vector<char>& drop) {
    std::map<ValueId, int64_t> result_of;  // value -> instruction index
    for (size_t k = 0; k < c.size(); ++k) result_of[g.nodes[c[k]].outputs[0]] = static_cast<int64_t>(k);
    std::vector<ValueId> inputs;
    std::vector<float> consts;
    std::vector<std::string> ops;
    std::vector<int64_t> raw;  // operands before input count is final: inputs as 1000 + i
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
        } else if (std::optional<double> s = scalar_const(g, idx, v)) {
          consts.push_back(static_cast<float>(*s));
          raw.push_back(-static_cast<int64_t>(consts.size()));
        } else {
          auto at = std::find(inputs.begin(), inputs.end(), v);
          if (at == inputs.end()) at = inputs.insert(inputs.end(), v);
          raw.push_back(kInputTag + (at - inputs.begin()));
        }
      }
    }
    if (inputs.size() > kMaxInputs || inputs.empty()) return false;
    const int64_t n_in = static_cast<int64_t>(inputs.size());
    std::vector<int64_t> operands;
    for (int64_t o : raw) {
      if (o == kInputTag * 2) operands.push_back(0);
      else if (o >= kInputTag) operands.push_back(o - kInputTag);
      else if (o >= 0) operands.push_back(o + n_in);
      else operands.push_back(o);
    }
    Node& root = g.nodes[c.back()];
    Attributes a;
    a.set("ops", ops);
    a.set("operands", operands);
    if (!consts.empty()) a.set("consts", consts);  // absent = none (an empty list has no ONNX type)
    // Edited in place: the root keeps its name, output and flags.
    root.domain = kOurDomain;
    root.op_type = "FusedElementwise";
    root.inputs = std::move(inputs);
    root.attrs = std::move(a);
    for (size_t k = 0; k + 1 < c.size(); ++k) drop[c[k]] = 1;
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_elementwise_chain_fusion_pass() { return std::make_unique<ElementwiseChainFusion>(); }

}  // namespace torch_ort
