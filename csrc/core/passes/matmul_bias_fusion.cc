// MatMul(X, W) + bias -> one com.torch_ort::FusedMatMul(X, W, bias): a single GEMM whose epilogue
// adds the bias (addmm), as eager F.linear runs, instead of a GEMM plus a full pass over Y. Covers
// the 3-D activation × 2-D weight case (the kernel flattens the rows). Fires only for a bias that
// varies along the last dim alone ((N) or (1, .., 1, N)); any other Add operand is left alone.
#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"
#include "csrc/core/passes/rewrite.h"

namespace torch_ort {
namespace {

using namespace pattern;

// A product we can give a bias: MatMul of rank >= 2 operands, or a bias-less FusedMatMul.
bool biasable_product(const Graph& g, const Node& m) {
  const bool mm = is_onnx(m, "MatMul") && m.inputs.size() == 2;
  const bool fused = is_ours(m, "FusedMatMul") && !has_input(m, 2) && m.inputs.size() >= 2;
  if (!(mm || fused) || m.outputs.size() != 1 || !has_input(m, 0) || !has_input(m, 1)) return false;
  return rank_of(g, m.inputs[0]) >= 2 && rank_of(g, m.inputs[1]) >= 2;
}

// bias (.., N) adds one value per output column of y (.., N): rank <= y's, every dim but the last
// provably 1, the last provably N.
bool is_row_bias(const Graph& g, ValueId bias, ValueId y) {
  const Value& b = g.value(bias);
  const Shape& ys = g.value(y).shape;
  if (b.dtype != g.value(y).dtype || !b.shape.rank_known || !ys.rank_known) return false;
  if (b.shape.rank() < 1 || b.shape.rank() > ys.rank()) return false;
  for (size_t i = 0; i + 1 < b.shape.dims.size(); ++i)
    if (!(b.shape.dims[i].is_known() && b.shape.dims[i].value == 1)) return false;
  return b.shape.dims.back().same_as(ys.dims.back());
}

const rewrite::Rule kRule{
    "MatMul(x, w) + bias -> FusedMatMul(x, w, bias)",
    rewrite::op("Add").as("add").commutative().with_outputs(1).in({
        rewrite::from(rewrite::where(biasable_product).as("mm").at_least_these_inputs().in(
                          {rewrite::val("x"), rewrite::val("w")}),
                      "y"),
        rewrite::val("bias")}),
    [](const Graph& g, const rewrite::Match& m) {
      const ValueId y = m.value("y"), bias = m.value("bias");
      if (y == bias || !is_row_bias(g, bias, y)) return false;
      // The Add's output must be the product's shape (the bias never widens it).
      const Node& add = g.nodes[m.node("add")];
      return g.value(add.outputs[0]).shape.same_as(g.value(y).shape) || !g.value(add.outputs[0]).shape.rank_known;
    },
    [](const Graph& g, const rewrite::Match& m, const Node& add) {
      const Node& mm = g.nodes[m.node("mm")];
      // The fused node takes the Add's place (after the bias is defined); the product goes.
      return Node{kOurDomain, "FusedMatMul", add.name, {m.value("x"), m.value("w"), m.value("bias")}, add.outputs,
                  is_ours(mm, "FusedMatMul") ? mm.attrs : Attributes{}};
    }};

class MatMulBiasFusion final : public Pass {
 public:
  std::string_view name() const override { return "matmul_bias_fusion"; }
  bool run(Graph& g) override { return rewrite::apply(g, {kRule}); }
};

}  // namespace

std::unique_ptr<Pass> make_matmul_bias_fusion_pass() { return std::make_unique<MatMulBiasFusion>(); }

}  // namespace torch_ort
