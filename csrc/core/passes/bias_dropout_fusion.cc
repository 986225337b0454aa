// Dropout fused with its neighbours -> com.torch_ort::BiasDropout(X, [Bias], [Residual], [ratio],
// [training_mode]) with outputs (Y, [Mask]): Y = Dropout(X + Bias) + Residual, Mask 1 byte/element.
//
// Pattern (at least one of the two adds must be there; both when they are):
//   [d = Add(x, bias)]        bias 1-D over the last dim, d read only by the Dropout
//   y, [mask] = Dropout(d, ratio, training_mode)
//   [z = Add(y, residual)]    residual of y's shape, y read only by this Add
// The fused node runs where the Dropout ran, so the random draws keep eager's order (the kernel
// draws exactly what eager's dropout draws); a residual computed after the Dropout is therefore
// not folded. Runs after skip_layer_norm_fusion (pipeline.cc): a residual add that feeds a
// LayerNorm (BERT post-LN, every pre-LN block) is already SkipLayerNorm's, leaving the bias here.
#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"
#include "csrc/core/passes/rewrite.h"

namespace torch_ort {
namespace {

using namespace pattern;

// A Dropout of float data whose draws are eager's stream, its mask read by nothing in the
// forward graph (it would have to exist before the fused node's position).
bool plain_dropout(const Graph& g, const rewrite::Match& m) {
  const Node& d = g.nodes[m.node("dropout")];
  if (d.attrs.has("seed")) return false;  // a fixed-seed draw is not eager's stream
  if (d.outputs.empty() || d.outputs[0] == kNoValue) return false;
  if (d.outputs.size() > 1 && d.outputs[1] != kNoValue &&
      (!m.readers(d.outputs[1]).empty() || is_graph_output(g, d.outputs[1])))
    return false;
  const Value& dv = g.value(d.inputs[0]);
  return is_floating(dv.dtype) && dv.shape.rank_known && dv.shape.rank() >= 1;
}

Node bias_dropout(Graph& g, const rewrite::Match& m, bool bias, bool residual) {
  const Node& d = g.nodes[m.node("dropout")];
  const ValueId y = residual ? g.nodes[m.node("res_add")].outputs[0] : d.outputs[0];
  const bool has_mode = m.value("mode") != kNoValue;
  ValueId mask = d.outputs.size() > 1 ? d.outputs[1] : kNoValue;
  if (mask == kNoValue && has_mode)  // training: backward reuses the forward's mask
    mask = g.new_value(g.value(y).name + "/mask", DType::kBool, g.value(d.inputs[0]).shape);
  std::vector<ValueId> ins{m.value("x"), bias ? m.value("bias") : kNoValue, residual ? m.value("residual") : kNoValue,
                           m.value("ratio"), m.value("mode")};
  while (!ins.empty() && ins.back() == kNoValue) ins.pop_back();
  std::vector<ValueId> outs{y};
  if (mask != kNoValue) outs.push_back(mask);
  return Node{kOurDomain, "BiasDropout", d.name, std::move(ins), std::move(outs), d.attrs};
}

rewrite::Rule bias_dropout_rule(bool bias, bool residual) {
  using namespace rewrite;
  const Input data = bias ? from(op("Add").commutative().in({val("bias"), val("x")}), "d") : val("x");
  NodePattern root = op("Dropout").as("dropout").in({data, opt("ratio"), opt("mode")});
  if (residual) root.read_by("y", op("Add").as("res_add").commutative().in({val("y"), val("residual")}));
  return Rule{std::string("Dropout") + (bias ? "(x + bias)" : "(x)") + (residual ? " + residual" : "") + " -> BiasDropout",
         std::move(root),
         [bias, residual](const Graph& g, const Match& m) {
           if (!plain_dropout(g, m)) return false;
           const ValueId x = m.value("x");
           const ValueId d = bias ? m.value("d") : x;
           if (bias && !(is_bias_of(g, m.value("bias"), x) && g.value(x).dtype == g.value(d).dtype &&
                         g.value(x).shape.same_as(g.value(d).shape)))
             return false;
           if (!residual) return true;
           const Node& add = g.nodes[m.node("res_add")];
           const ValueId res = m.value("residual");
           return add.inputs[0] != add.inputs[1] && g.value(res).dtype == g.value(d).dtype &&
                  g.value(res).shape.same_as(g.value(d).shape) && g.value(add.outputs[0]).shape.same_as(g.value(d).shape);
         },
         [bias, residual](Graph& g, const Match& m, const Node&) { return bias_dropout(g, m, bias, residual); }};
}

class BiasDropoutFusion final : public Pass {
 public:
  std::string_view name() const override { return "bias_dropout_fusion"; }
  bool run(Graph& g) override {
    return rewrite::apply(g, {bias_dropout_rule(true, true), bias_dropout_rule(false, true),
                              bias_dropout_rule(true, false)});
  }
};

}  // namespace

std::unique_ptr<Pass> make_bias_dropout_fusion_pass() { return std::make_unique<BiasDropoutFusion>(); }

}  // namespace torch_ort
