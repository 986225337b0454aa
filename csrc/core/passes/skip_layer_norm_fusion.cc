// Residual add + LayerNormalization -> com.torch_ort::SkipLayerNorm(X, Skip, Gamma, [Beta], [Bias])
// with outputs (Y, Mean, InvStdDev, Sum). Every transformer block normalises a residual sum; fused,
// the sum is written once and normalised while its row is still in cache, and the backward is one
// SkipLayerNormGrad instead of LayerNormalizationGrad + ScaleGrad + ReduceSum + the fan-out Add.
//
// Pattern (the LN normalises the last dim only):
//   s = Add(a, b)                       a, b provably of s's shape (no broadcasting)
//   [a = Add(p, bias)]                  optional: bias 1-D over the last dim, a read only by s
//   y, [mean], [invstd] = LayerNormalization(s, gamma, [beta])
// Sum = s stays a value of the graph: pre-LN blocks (NanoGPT, GPT-2) feed it to the next residual
// add, post-LN blocks (BERT) do not, and backward always needs it (to rebuild x̂).
#include <optional>
#include <vector>

#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"

namespace torch_ort {
namespace {

using namespace pattern;

// Rank-1 value whose single dim is provably `c` (the normalised size).
bool is_vector_of(const Graph& g, ValueId v, const Dim& c) {
  const Shape& s = g.value(v).shape;
  return s.rank() == 1 && s.dims[0].same_as(c);
}

struct Match {
  NodeId add = -1, ln = -1, bias_add = -1;  // the residual Add, the LN, the folded bias Add (or -1)
  ValueId x = kNoValue, skip = kNoValue, bias = kNoValue;
};

class SkipLayerNormFusion final : public Pass {
 public:
  std::string_view name() const override { return "skip_layer_norm_fusion"; }

  bool run(Graph& g) override { return fuse_each(g, "LayerNormalization", match, rewrite); }

 private:
  static std::optional<Match> match(const Graph& g, const GraphIndex& idx, NodeId ln_id) {
    const Node& ln = g.nodes[ln_id];
    if (ln.inputs.size() < 2 || ln.inputs[0] == kNoValue || ln.inputs[1] == kNoValue) return std::nullopt;
    // Mean/InvStdDev read by anyone: their gradients would need the general LN rule.
    for (size_t k = 1; k < ln.outputs.size(); ++k)
      if (ln.outputs[k] != kNoValue &&
          (!idx.consumers[ln.outputs[k]].empty() || is_graph_output(g, ln.outputs[k])))
        return std::nullopt;
    const ValueId s = ln.inputs[0];
    const Value& sv = g.value(s);
    if (!is_floating(sv.dtype) || !sv.shape.rank_known || sv.shape.rank() < 1) return std::nullopt;
    const int64_t r = sv.shape.rank(), axis = ln.attrs.get_int("axis", -1);
    if (axis != -1 && axis != r - 1) return std::nullopt;  // normalises more than the last dim
    if (ln.attrs.get_int("stash_type", 1) != 1) return std::nullopt;
    const Dim& c = sv.shape.dims.back();
    if (!is_vector_of(g, ln.inputs[1], c)) return std::nullopt;
    const bool has_beta = ln.inputs.size() > 2 && ln.inputs[2] != kNoValue;
    if (has_beta && !is_vector_of(g, ln.inputs[2], c)) return std::nullopt;

    const NodeId add_id = idx.producer[s];
    if (add_id < 0 || !is_onnx(g.nodes[add_id], "Add") || g.nodes[add_id].inputs.size() != 2)
      return std::nullopt;
    const Node& add = g.nodes[add_id];
    for (ValueId in : add.inputs)
      if (in == kNoValue || g.value(in).dtype != sv.dtype || !g.value(in).shape.same_as(sv.shape))
        return std::nullopt;
    // Gamma/Beta must exist where the fused node goes (the residual Add's position).
    for (size_t k = 1; k < ln.inputs.size() && k < 3; ++k)
      if (ln.inputs[k] != kNoValue && idx.producer[ln.inputs[k]] >= add_id) return std::nullopt;

    Match m{add_id, ln_id, -1, add.inputs[0], add.inputs[1], kNoValue};
    // Fold a bias add on either operand when nothing else reads its result.
    for (int side = 0; side < 2 && m.bias_add < 0 && add.inputs[0] != add.inputs[1]; ++side) {
      if (std::optional<BiasAdd> b = bias_add_read_only_by(g, idx, add.inputs[side], add_id, sv.shape, sv.dtype)) {
        m.bias_add = b->add;
        m.x = b->data;
        m.bias = b->bias;
        m.skip = add.inputs[1 - side];
      }
    }
    return m;
  }

  static void rewrite(Graph& g, const Match& m) {
    const Node ln = g.nodes[m.ln];
    const ValueId s = g.nodes[m.add].outputs[0];
    const Value sv = g.value(s);
    // Per-row statistics: X's leading dims, 1 for the normalised one; float unless X is double.
    Shape stats = sv.shape;
    stats.dims.back() = Dim::known(1);
    const DType st = sv.dtype == DType::kDouble ? DType::kDouble : DType::kFloat;
    std::vector<ValueId> outs{ln.outputs[0], kNoValue, kNoValue, s};
    for (int k : {1, 2}) {
      if (static_cast<size_t>(k) < ln.outputs.size() && ln.outputs[k] != kNoValue) {
        outs[k] = ln.outputs[k];
        g.value(outs[k]).dtype = st;
        g.value(outs[k]).shape = stats;
      } else {
        outs[k] = g.new_value(g.value(ln.outputs[0]).name + (k == 1 ? "/mean" : "/inv_std_dev"), st, stats);
      }
    }
    std::vector<ValueId> ins{m.x, m.skip, ln.inputs[1], kNoValue, kNoValue};
    if (ln.inputs.size() > 2) ins[3] = ln.inputs[2];
    ins[4] = m.bias;
    while (!ins.empty() && ins.back() == kNoValue) ins.pop_back();
    Attributes a;
    a.set("epsilon", ln.attrs.get_float("epsilon", 1e-5f));
    // The fused node takes the residual Add's place: every reader of Sum comes after it.
    fuse_into(g, m.add, Node{kOurDomain, "SkipLayerNorm", ln.name, std::move(ins), std::move(outs), std::move(a)},
              {m.ln, m.bias_add});
  }
};

}  // namespace

std::unique_ptr<Pass> make_skip_layer_norm_fusion_pass() { return std::make_unique<SkipLayerNormFusion>(); }

}  // namespace torch_ort
