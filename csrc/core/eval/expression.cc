// Expressions over constants and shapes (eval/expression.h).
#include "csrc/core/eval/expression.h"

#include <cmath>
#include <map>
#include <string>

#include "csrc/core/eval/eval.h"
#include "csrc/core/ir/pattern.h"

namespace torch_ort::eval {
namespace {

// Sizes for the unknown dims Shape nodes read: one per symbol (an unnamed dim is its own), each
// given the next of a list of distinct sizes the first time it is read unless already set.
struct Sizes {
  std::map<std::string, int64_t> of;
  std::map<std::string, std::vector<ValueId>> last_of;  // the values whose last dim it is
  int64_t size(const std::string& key) {
    static constexpr int64_t kDistinct[] = {7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47};
    auto it = of.find(key);
    if (it != of.end()) return it->second;
    const int64_t s = of.size() < std::size(kDistinct) ? kDistinct[of.size()] : 53 + static_cast<int64_t>(of.size());
    return of[key] = s;
  }
};

std::optional<Tensor> evaluate(const Graph& g, const GraphIndex& idx, ValueId v, Sizes& sizes, int depth) {
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
        const Dim& d = xs.dims[i];
        if (d.is_known()) {
          all.push_back(d.value);
          continue;
        }
        const std::string key = d.is_symbolic() ? d.symbol : "?" + std::to_string(n.inputs[0]) + ":" + std::to_string(i);
        if (i + 1 == xs.dims.size()) sizes.last_of[key].push_back(n.inputs[0]);
        all.push_back(sizes.size(key));
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
      } else if (std::optional<Tensor> t = evaluate(g, idx, n.inputs[i], sizes, depth + 1)) {
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

// v's one element with these sizes (NaN: none).
double at(const Graph& g, const GraphIndex& idx, ValueId v, Sizes sizes) {
  const std::optional<Tensor> t = evaluate(g, idx, v, sizes, 0);
  return t && t->numel() == 1 ? t->at(0) : std::nan("");
}

}  // namespace

std::optional<Monomial> monomial(const Graph& g, const GraphIndex& idx, ValueId v) {
  if (v == kNoValue || g.value(v).shape.rank() > 4) return std::nullopt;
  Sizes base;
  const std::optional<Tensor> t = evaluate(g, idx, v, base, 0);
  if (!t || t->numel() != 1 || std::isnan(t->at(0))) return std::nullopt;
  const double r0 = t->at(0);
  // The dims it depends on: changing one alone changes it.
  std::vector<std::string> depends;
  for (const auto& [key, size] : base.of) {
    Sizes other = base;
    other.of[key] = 2 * size + 3;
    if (at(g, idx, v, other) != r0) depends.push_back(key);
  }
  if (depends.empty()) return Monomial{r0, 0.0, {}};  // a constant (±inf too: a mask's fill)
  if (depends.size() > 1 || base.last_of[depends[0]].empty() || !std::isfinite(r0)) return std::nullopt;
  // One last dim D: coef · D^power, fitted on two sizes and checked on sizes no rounding hides.
  const double d[] = {4, 9, 96, 128, 1000};
  double r[5];
  for (int i = 0; i < 5; ++i) {
    Sizes s = base;
    s.of[depends[0]] = static_cast<int64_t>(d[i]);
    r[i] = at(g, idx, v, s);
    if (!(r[i] > 0) || !std::isfinite(r[i])) return std::nullopt;
  }
  Monomial m{0.0, 0.0, base.last_of[depends[0]]};
  const double power = std::log(r[1] / r[0]) / std::log(d[1] / d[0]);
  m.power = std::round(power * 4) / 4;
  m.coef = r[0] / std::pow(d[0], m.power);
  if (std::abs(power - m.power) > 1e-6) return std::nullopt;
  for (int i = 2; i < 5; ++i)
    if (std::abs(m.coef * std::pow(d[i], m.power) / r[i] - 1) > 1e-9) return std::nullopt;
  return m;
}

std::optional<double> scalar(const Graph& g, const GraphIndex& idx, ValueId v) {
  const std::optional<Monomial> m = monomial(g, idx, v);
  return m && m->dim_of.empty() ? std::optional<double>(m->coef) : std::nullopt;
}

}  // namespace torch_ort::eval
