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
// add, post-LN blocks (BERT) do not, and backward always needs it (to rebuild x̂). The fused node
// takes the residual Add's place: every reader of Sum comes after it.
#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"
#include "csrc/core/passes/rewrite.h"

namespace torch_ort {
namespace {

using namespace pattern;

// Rank-1 value whose single dim is provably `c` (the normalised size).
bool is_vector_of(const Graph& g, ValueId v, const Dim& c) {
  const Shape& s = g.value(v).shape;
  return s.rank() == 1 && s.dims[0].same_as(c);
}

// The LayerNormalization normalises the last dim of s, its statistics unread (their gradients would
// need the general LN rule), and both operands of the residual Add are of s's dtype and shape.
bool normalises_the_sum(const Graph& g, const rewrite::Match& m) {
  const Node& ln = g.nodes[m.node("ln")];
  for (size_t k = 1; k < ln.outputs.size(); ++k)
    if (ln.outputs[k] != kNoValue && (!m.readers(ln.outputs[k]).empty() || is_graph_output(g, ln.outputs[k])))
      return false;
  const Value& sv = g.value(m.value("s"));
  if (!is_floating(sv.dtype) || !sv.shape.rank_known || sv.shape.rank() < 1) return false;
  const int64_t axis = ln.attrs.get_int("axis", -1);
  if ((axis != -1 && axis != sv.shape.rank() - 1) || ln.attrs.get_int("stash_type", 1) != 1) return false;
  const Dim& c = sv.shape.dims.back();
  if (!is_vector_of(g, m.value("gamma"), c) || (m.value("beta") != kNoValue && !is_vector_of(g, m.value("beta"), c)))
    return false;
  for (ValueId in : g.nodes[m.node("add")].inputs)
    if (g.value(in).dtype != sv.dtype || !g.value(in).shape.same_as(sv.shape)) return false;
  // Gamma and Beta exist where the fused node goes, the residual Add's place (checked here, before
  // the builder retypes the statistics).
  for (const char* p : {"gamma", "beta"}) {
    const ValueId v = m.value(p);
    if (v != kNoValue && v < static_cast<ValueId>(m.index().producer.size()) && m.index().producer[v] >= m.node("add"))
      return false;
  }
  return true;
}

Node skip_layer_norm(Graph& g, const rewrite::Match& m, bool fold_bias) {
  const Node& ln = g.nodes[m.node("ln")];
  const ValueId s = m.value("s");
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
  std::vector<ValueId> ins{fold_bias ? m.value("x") : m.value("a"), m.value("skip"), m.value("gamma"),
                           m.value("beta"), fold_bias ? m.value("bias") : kNoValue};
  while (ins.back() == kNoValue) ins.pop_back();
  Attributes a;
  a.set("epsilon", ln.attrs.get_float("epsilon", 1e-5f));
  return Node{kOurDomain, "SkipLayerNorm", ln.name, std::move(ins), std::move(outs), std::move(a)};
}

rewrite::Rule skip_layer_norm_rule(bool fold_bias) {
  using namespace rewrite;
  // a = Add(x, bias) read only by the residual Add (either operand, bias on either side).
  const Input a = fold_bias ? from(op("Add").commutative().in({val("bias"), val("x")}), "a") : val("a");
  NodePattern root = op("Add").as("add").in({a, val("skip")});
  if (fold_bias) root.commutative();  // the bias Add on either operand
  root.read_by("s", op("LayerNormalization").as("ln").in({val("s"), val("gamma"), opt("beta")}));
  return Rule{fold_bias ? "Add(Add(x, bias), skip) -> LayerNormalization -> SkipLayerNorm(x, skip, .., bias)"
                   : "Add(a, skip) -> LayerNormalization -> SkipLayerNorm(a, skip, ..)",
         std::move(root),
         [fold_bias](const Graph& g, const Match& m) {
           if (!normalises_the_sum(g, m)) return false;
           if (!fold_bias) return true;
           const ValueId x = m.value("x");
           return m.value("a") != m.value("skip") && is_bias_of(g, m.value("bias"), x) &&
                  g.value(x).dtype == g.value(m.value("a")).dtype && g.value(x).shape.same_as(g.value(m.value("a")).shape);
         },
         [fold_bias](Graph& g, const Match& m, const Node&) { return skip_layer_norm(g, m, fold_bias); }};
}

class SkipLayerNormFusion final : public Pass {
 public:
  std::string_view name() const override { return "skip_layer_norm_fusion"; }
  bool run(Graph& g) override { return rewrite::apply(g, {skip_layer_norm_rule(true), skip_layer_norm_rule(false)}); }
};

}  // namespace

std::unique_ptr<Pass> make_skip_layer_norm_fusion_pass() { return std::make_unique<SkipLayerNormFusion>(); }

}  // namespace torch_ort
