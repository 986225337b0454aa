// Expressions over constants and shapes (eval/expression.h).
#include "csrc/core/eval/expression.h"

#include <cmath>

#include "csrc/core/eval/eval.h"
#include "csrc/core/ir/pattern.h"

namespace torch_ort::eval {
namespace {

struct Trial {
  double last, other;      // the sizes of unknown dims
  std::vector<ValueId> dim_of;  // the values whose unknown last dim was read
};

std::optional<Tensor> evaluate(const Graph& g, const GraphIndex& idx, ValueId v, Trial& trial, int depth) {
  if (v == kNoValue || depth > 16) return std::nullopt;
  try {
    if (auto it = g.initializers.find(v); it != g.initializers.end()) return from_data(it->second);
    const NodeId p = v < static_cast<ValueId>(idx.producer.size()) ? idx.producer[v] : -1;
    if (p < 0 || !g.nodes[p].domain.empty()) return std::nullopt;
    const Node& n = g.nodes[p];
    if (is_constant(n)) {
      const std::optional<TensorData> d = pattern::constant_node_data(n);
      return d ? std::optional<Tensor>(from_data(*d)) : std::nullopt;
    }
    if (n.op_type == "Shape") {
      const Shape& xs = g.value(n.inputs[0]).shape;
      if (!xs.rank_known) return std::nullopt;
      Dims all;
      for (size_t i = 0; i < xs.dims.size(); ++i) {
        const bool last = i + 1 == xs.dims.size();
        if (!xs.dims[i].is_known() && last) trial.dim_of.push_back(n.inputs[0]);
        all.push_back(xs.dims[i].is_known() ? xs.dims[i].value : static_cast<int64_t>(last ? trial.last : trial.other));
      }
      const auto [b, e] = shape_range(n.attrs, xs.rank());
      return Tensor::of_ints(DType::kInt64, {e - b}, Dims(all.begin() + b, all.begin() + e));
    }
    if (!has_op("", n.op_type)) return std::nullopt;
    std::vector<Tensor> ins(n.inputs.size());
    Ins ptrs(n.inputs.size(), nullptr);
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (n.inputs[i] == kNoValue) continue;
      if (n.op_type == "CastLike" && i == 1) {  // its dtype only
        ins[i] = Tensor{g.value(n.inputs[i]).dtype, {0}, {}, {}};
      } else if (std::optional<Tensor> t = evaluate(g, idx, n.inputs[i], trial, depth + 1)) {
        ins[i] = std::move(*t);
      } else {
        return std::nullopt;
      }
      ptrs[i] = &ins[i];
    }
    Options opts;
    opts.max_elements = 64;
    std::vector<Tensor> outs = eval_node(n, ptrs, opts);
    for (size_t i = 0; i < n.outputs.size() && i < outs.size(); ++i)
      if (n.outputs[i] == v) return outs[i];
  } catch (const std::exception&) {  // an op the evaluator refuses: no expression we read
  }
  return std::nullopt;
}

}  // namespace

std::optional<Monomial> monomial(const Graph& g, const GraphIndex& idx, ValueId v) {
  if (v == kNoValue || g.value(v).shape.rank() > 4) return std::nullopt;
  Trial trials[3] = {{4, 7, {}}, {9, 11, {}}, {25, 13, {}}};
  double r[3];
  for (int i = 0; i < 3; ++i) {
    const std::optional<Tensor> t = evaluate(g, idx, v, trials[i], 0);
    if (!t || t->numel() != 1 || !std::isfinite(t->at(0))) return std::nullopt;
    r[i] = t->at(0);
  }
  Monomial m{r[0], 0.0, trials[0].dim_of};
  if (m.dim_of.empty()) return r[0] == r[1] && r[1] == r[2] ? std::optional<Monomial>(m) : std::nullopt;
  if (r[0] <= 0 || r[1] <= 0 || r[2] <= 0) return std::nullopt;
  const double power = std::log(r[1] / r[0]) / std::log(trials[1].last / trials[0].last);
  m.power = std::round(power * 4) / 4;
  m.coef = r[0] / std::pow(trials[0].last, m.power);
  if (std::abs(power - m.power) > 1e-6 || std::abs(m.coef * std::pow(trials[2].last, m.power) / r[2] - 1) > 1e-9)
    return std::nullopt;
  return m;
}

std::optional<double> scalar(const Graph& g, const GraphIndex& idx, ValueId v) {
  const std::optional<Monomial> m = monomial(g, idx, v);
  return m && m->dim_of.empty() ? std::optional<double>(m->coef) : std::nullopt;
}

}  // namespace torch_ort::eval
