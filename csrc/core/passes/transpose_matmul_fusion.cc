// Transpose(X) of the two innermost dims feeding a GEMM becomes the GEMM's transpose flag:
// Gemm's own transA/transB (2-D), and for MatMul/FusedMatMul with operands of rank >= 2 the
// flags of com.torch_ort::FusedMatMul (a MatMul is rewritten in place into one). The kernels read
// the transposed operand through a strided view, so no transposed copy is ever written.
//
// Works on any graph, the forward+backward training graph included: it only rewrites a GEMM in
// place and removes Transposes nobody reads any more, so every remaining node keeps its half. A
// chain Transpose(Transpose(x)) (a backward rule transposing a transposed weight) folds link by
// link, one scan of the rules per link.
#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"
#include "csrc/core/passes/rewrite.h"

namespace torch_ort {
namespace {

using namespace pattern;

// A GEMM whose operands may carry a transpose flag: Gemm of 2-D operands, MatMul/FusedMatMul of
// operands of rank >= 2 (rank 1 has numpy's vector semantics).
bool flaggable_gemm(const Graph& g, const Node& n) {
  const bool gemm = is_onnx(n, "Gemm"), mm = is_onnx(n, "MatMul") && n.inputs.size() == 2;
  if (!(gemm || mm || is_ours(n, "FusedMatMul")) || !has_input(n, 0) || !has_input(n, 1)) return false;
  const int64_t ra = rank_of(g, n.inputs[0]), rb = rank_of(g, n.inputs[1]);
  return gemm ? ra == 2 && rb == 2 : ra >= 2 && rb >= 2;
}

rewrite::Rule fold(int k) {
  using namespace rewrite;
  // The Transpose is only seen: another reader keeps it; dead ones go after the scans.
  const Input swapped = sees(where(swaps_last_two).in({val("x")}), "t");
  const char* flag = k == 0 ? "transA" : "transB";
  return Rule{std::string("GEMM(") + (k == 0 ? "Transpose(x), b" : "a, Transpose(x)") + ") -> GEMM(..) with " + flag,
              where(flaggable_gemm).at_least_these_inputs().in(k == 0 ? std::vector<Input>{swapped, val("other")}
                                                                       : std::vector<Input>{val("other"), swapped}),
              [](const Graph&, const Match& m) { return m.value("other") != m.value("t"); },  // a Gram product stays
              [k, flag](Graph&, const Match& m, const Node& gemm) {
                Node n = gemm;
                if (is_onnx(n, "MatMul")) n = Node{kOurDomain, "FusedMatMul", n.name, n.inputs, n.outputs, {}};
                n.attrs.set(flag, static_cast<int64_t>(n.attrs.get_int(flag, 0) == 0));
                n.inputs[k] = m.value("x");
                return n;
              }};
}

class TransposeMatMulFusion final : public Pass {
 public:
  std::string_view name() const override { return "transpose_matmul_fusion"; }

  bool run(Graph& g) override {
    std::vector<char> was_read(g.num_values(), 0);
    {
      const GraphIndex before(g);
      for (ValueId v = 0; v < g.num_values(); ++v) was_read[v] = !before.consumers[v].empty();
    }
    bool changed = false;
    while (rewrite::apply(g, {fold(0), fold(1)})) changed = true;
    if (!changed) return false;
    // Transposes whose every reader took the flag instead are dead now; walking backwards frees
    // the inner links of a chain once their outer Transpose goes.
    const GraphIndex idx(g);
    std::vector<int64_t> reads(g.num_values(), 0);
    for (ValueId v = 0; v < g.num_values(); ++v) reads[v] = static_cast<int64_t>(idx.consumers[v].size());
    std::vector<char> drop(g.nodes.size(), 0);
    for (NodeId i = static_cast<NodeId>(g.nodes.size()); i-- > 0;) {
      const Node& t = g.nodes[i];
      if (!is_onnx(t, "Transpose") || t.outputs.size() != 1 || t.outputs[0] == kNoValue) continue;
      if (!was_read[t.outputs[0]] || reads[t.outputs[0]] != 0 || is_graph_output(g, t.outputs[0])) continue;
      drop[i] = 1;
      if (has_input(t, 0)) --reads[t.inputs[0]];
    }
    erase_nodes(g, drop);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_transpose_matmul_fusion_pass() { return std::make_unique<TransposeMatMulFusion>(); }

}  // namespace torch_ort
