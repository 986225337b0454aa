// Transpose(X) of the two innermost dims feeding a GEMM becomes the GEMM's transpose flag:
// Gemm's own transA/transB (2-D), and for MatMul/FusedMatMul with operands of rank >= 2 the
// flags of com.torch_ort::FusedMatMul (a MatMul is rewritten in place into one). The kernels read
// the transposed operand through a strided view, so no transposed copy is ever written.
//
// Works on any graph, the forward+backward training graph included: it only rewrites a GEMM in
// place and removes Transposes nobody reads any more, so every remaining node keeps its half.
#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"

namespace torch_ort {
namespace {

using namespace pattern;

class TransposeMatMulFusion final : public Pass {
 public:
  std::string_view name() const override { return "transpose_matmul_fusion"; }

  bool run(Graph& g) override {
    const GraphIndex idx(g);
    std::vector<int64_t> reads(g.num_values(), 0);  // readers left per Transpose output
    for (ValueId v = 0; v < g.num_values(); ++v) reads[v] = static_cast<int64_t>(idx.consumers[v].size());
    bool changed = false;
    for (NodeId i = 0; i < static_cast<NodeId>(g.nodes.size()); ++i) {
      Node& n = g.nodes[i];
      const bool gemm = is_onnx(n, "Gemm"), fused = is_ours(n, "FusedMatMul");
      bool mm = is_onnx(n, "MatMul");
      if (!(gemm || mm || fused) || !has_input(n, 0) || !has_input(n, 1)) continue;
      const int64_t ra = rank_of(g, n.inputs[0]), rb = rank_of(g, n.inputs[1]);
      if (gemm ? (ra != 2 || rb != 2) : (ra < 2 || rb < 2)) continue;
      for (int k = 0; k < 2; ++k) {
        // A chain Transpose(Transpose(x)) (a backward rule transposing a transposed weight)
        // folds link by link.
        for (;;) {
          const ValueId v = n.inputs[k];
          const NodeId p = idx.producer[v];
          if (p < 0 || !swaps_last_two(g, g.nodes[p])) break;
          if (n.inputs[1 - k] == v) break;  // MatMul(t, t): a Gram product, left as it is
          if (mm) {  // MatMul has no flags: it becomes FusedMatMul (same semantics for rank >= 2)
            n.domain = kOurDomain;
            n.op_type = "FusedMatMul";
            n.attrs = Attributes{};
            mm = false;
          }
          const char* flag = k == 0 ? "transA" : "transB";
          n.attrs.set(flag, static_cast<int64_t>(n.attrs.get_int(flag, 0) == 0));
          n.inputs[k] = g.nodes[p].inputs[0];
          --reads[v];             // this GEMM no longer reads the Transpose's output...
          ++reads[n.inputs[k]];   // ...but its input, which must then outlive the drop below
          changed = true;
        }
      }
    }
    // Transposes whose every reader took the flag instead are dead now; walking backwards frees
    // the inner links of a chain once their outer Transpose goes.
    std::vector<char> drop(g.nodes.size(), 0);
    for (NodeId i = static_cast<NodeId>(g.nodes.size()); i-- > 0;) {
      const Node& t = g.nodes[i];
      if (!is_onnx(t, "Transpose") || t.outputs.size() != 1 || t.outputs[0] == kNoValue) continue;
      if (idx.consumers[t.outputs[0]].empty() || reads[t.outputs[0]] != 0 || is_graph_output(g, t.outputs[0]))
        continue;
      drop[i] = 1;
      if (has_input(t, 0)) --reads[t.inputs[0]];
    }
    erase_nodes(g, drop);
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> make_transpose_matmul_fusion_pass() { return std::make_unique<TransposeMatMulFusion>(); }

}  // namespace torch_ort
