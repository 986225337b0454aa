// Dropout fused with its neighbours -> com.torch_ort::BiasDropout(X, [Bias], [Residual], [ratio],
// [training_mode]) with outputs (Y, [Mask]): Y = Dropout(X + Bias) + Residual, Mask 1 byte/element.
//
// Pattern (at least one of the two adds must be there):
//   [d = Add(x, bias)]        bias 1-D over the last dim, d read only by the Dropout
//   y, [mask] = Dropout(d, ratio, training_mode)
//   [z = Add(y, residual)]    residual of y's shape, y read only by this Add
// The fused node runs where the Dropout ran, so the random draws keep eager's order (the kernel
// draws exactly what eager's dropout draws); a residual computed after the Dropout is therefore
// not folded. Runs after skip_layer_norm_fusion (pipeline.cc): a residual add that feeds a
// LayerNorm (BERT post-LN, every pre-LN block) is already SkipLayerNorm's, leaving the bias here.
#include <optional>
#include <vector>

#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"

namespace torch_ort {
namespace {

using namespace pattern;

struct Match {
  NodeId dropout = -1, bias_add = -1, res_add = -1;
  ValueId x = kNoValue, bias = kNoValue, residual = kNoValue;
};

class BiasDropoutFusion final : public Pass {
 public:
  std::string_view name() const override { return "bias_dropout_fusion"; }

  bool run(Graph& g) override { return fuse_each(g, "Dropout", match, rewrite); }

 private:
  static std::optional<Match> match(const Graph& g, const GraphIndex& idx, NodeId d_id) {
    const Node& d = g.nodes[d_id];
    if (d.inputs.empty() || d.inputs[0] == kNoValue || d.outputs.empty() || d.outputs[0] == kNoValue)
      return std::nullopt;
    if (d.attrs.has("seed")) return std::nullopt;  // a fixed-seed draw is not eager's stream
    // A mask read in the forward graph would have to exist before the fused node's position.
    if (d.outputs.size() > 1 && d.outputs[1] != kNoValue &&
        (!idx.consumers[d.outputs[1]].empty() || is_graph_output(g, d.outputs[1])))
      return std::nullopt;
    const ValueId data = d.inputs[0], y = d.outputs[0];
    const Value& dv = g.value(data);
    if (!is_floating(dv.dtype) || !dv.shape.rank_known || dv.shape.rank() < 1) return std::nullopt;
    Match m{d_id, -1, -1, data, kNoValue, kNoValue};

    if (std::optional<BiasAdd> b = bias_add_read_only_by(g, idx, data, d_id, dv.shape, dv.dtype)) {
      m.bias_add = b->add;
      m.x = b->data;
      m.bias = b->bias;
    }
    if (idx.consumers[y].size() == 1 && !is_graph_output(g, y)) {
      const NodeId r = idx.consumers[y][0];
      const Node& ra = g.nodes[r];
      if (is_onnx(ra, "Add") && ra.inputs.size() == 2 && ra.inputs[0] != ra.inputs[1]) {
        const ValueId res = ra.inputs[0] == y ? ra.inputs[1] : ra.inputs[0];
        const bool ready = res != kNoValue && idx.producer[res] < d_id;  // exists where the Dropout runs
        if (ready && g.value(res).dtype == dv.dtype && g.value(res).shape.same_as(dv.shape) &&
            g.value(ra.outputs[0]).shape.same_as(dv.shape)) {
          m.res_add = r;
          m.residual = res;
        }
      }
    }
    if (m.bias_add < 0 && m.res_add < 0) return std::nullopt;
    return m;
  }

  static void rewrite(Graph& g, const Match& m) {
    const Node d = g.nodes[m.dropout];
    const ValueId y = m.res_add >= 0 ? g.nodes[m.res_add].outputs[0] : d.outputs[0];
    const bool has_mode = d.inputs.size() > 2 && d.inputs[2] != kNoValue;
    ValueId mask = d.outputs.size() > 1 ? d.outputs[1] : kNoValue;
    if (mask == kNoValue && has_mode)  // training: backward reuses the forward's mask
      mask = g.new_value(g.value(y).name + "/mask", DType::kBool, g.value(d.inputs[0]).shape);
    std::vector<ValueId> ins{m.x, m.bias, m.residual, d.inputs.size() > 1 ? d.inputs[1] : kNoValue,
                             has_mode ? d.inputs[2] : kNoValue};
    while (!ins.empty() && ins.back() == kNoValue) ins.pop_back();
    std::vector<ValueId> outs{y};
    if (mask != kNoValue) outs.push_back(mask);
    fuse_into(g, m.dropout, Node{kOurDomain, "BiasDropout", d.name, std::move(ins), std::move(outs), d.attrs},
              {m.bias_add, m.res_add});
  }
};

}  // namespace

std::unique_ptr<Pass> make_bias_dropout_fusion_pass() { return std::make_unique<BiasDropoutFusion>(); }

}  // namespace torch_ort
