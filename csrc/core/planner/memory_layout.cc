// Views and in-place reuse: which buffer each value lives in, as our runtime kernels lay it out,
// and which steps may write their output over a dying input (see memory.h).
//
// The alias table follows csrc/runtime/kernels: shape_ops.cc (Reshape/Flatten via at::reshape,
// Transpose via permute, Squeeze/Unsqueeze/Expand), slice.cc (Slice, Split, ConcatGrad narrow),
// elementwise.cc (Identity, Cast to its own dtype, Dropout in inference, single-operand Sum),
// grad_ops.cc, reduce.cc, compare.cc, fused_dropout.cc and aten_fallback.cc (detached leaves).
// Approximations, each on the side of "new buffer" unless stated:
//   - at::reshape views a contiguous input and copies any other; in ATen a non-contiguous input
//     whose strides still fit the new shape is viewed too (we count a copy).
//   - contiguity: outputs of non-view kernels are contiguous and own their whole buffer; Slice,
//     Split and ConcatGrad views are contiguous only when they cut axis 0 with step 1, and never
//     cover their whole buffer; Transpose is contiguous when it moves only size-1 dims.
//   - conditional pass-throughs (Dropout in inference, SumToShape of an equal shape) are decided
//     from constants and provable shapes; when unknown, a new buffer is assumed.
//   - a kernel returning a view of its own larger scratch (Conv's crop, attention's narrowed
//     statistics) is counted at the value's bytes, not the scratch's.
//   - Sum passes an operand through when the other ones are absent output gradients (a None from
//     autograd): decided per call, not modelled.
#include <algorithm>
#include <functional>
#include <map>

#include "csrc/core/autodiff/aten_op.h"
#include "csrc/core/planner/memory.h"

namespace torch_ort {
namespace {

using Layouts = std::vector<ValueLayout>;
using Rule = std::function<std::optional<AliasRule>(const Graph&, const Node&, int, const Layouts&)>;

bool has(const Node& n, int i) {
  return i >= 0 && i < static_cast<int>(n.inputs.size()) && n.inputs[i] != kNoValue;
}
// Values of a constant input, or nullopt when absent, not constant or not numeric.
std::optional<std::vector<double>> constant_values(const Node& n, int i, const Layouts& l) {
  if (!has(n, i) || !l[n.inputs[i]].data) return std::nullopt;
  try {
    return l[n.inputs[i]].data->as_doubles();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}
bool constant_is(const Node& n, int i, const Layouts& l, double v) {
  auto d = constant_values(n, i, l);
  return d && d->size() == 1 && (*d)[0] == v;
}
// Dropout's kernels pass X (or dY) through when training_mode is absent or false, or ratio is 0.
bool dropout_passes_through(const Node& n, int ratio, int training, const Layouts& l) {
  return !has(n, training) || constant_is(n, training, l, 0.0) || constant_is(n, ratio, l, 0.0);
}

// The view keeps the layout of input `i`.
AliasRule same_layout(const Node& n, int i, const Layouts& l) {
  const ValueLayout& in = l[n.inputs[i]];
  return AliasRule{i, false, in.contiguous, in.whole};
}
bool same_shape(const Graph& g, ValueId a, ValueId b) {
  return g.value(a).shape.same_as(g.value(b).shape);
}
// at::reshape: a view of a contiguous input, a copy of any other.
std::optional<AliasRule> reshape(const Graph&, const Node& n, int, const Layouts& l) {
  if (!l[n.inputs[0]].contiguous) return std::nullopt;
  return same_layout(n, 0, l);
}
std::optional<AliasRule> view_of_input0(const Graph&, const Node& n, int, const Layouts& l) {
  return same_layout(n, 0, l);
}
// permute: contiguous when the dims it moves (leaving size-1 dims aside) keep their order.
std::optional<AliasRule> transpose(const Graph& g, const Node& n, int, const Layouts& l) {
  AliasRule r = same_layout(n, 0, l);
  const Shape& s = g.value(n.inputs[0]).shape;
  std::vector<int64_t> perm = n.attrs.get_ints("perm", {});
  if (perm.empty())
    for (int64_t d = s.rank() - 1; d >= 0; --d) perm.push_back(d);  // default: reverse
  if (perm.empty() && s.rank() != 0) r.contiguous = false;          // unknown rank
  int64_t last = -1;
  for (int64_t d : perm) {
    if (s.rank_known && d >= 0 && d < s.rank() && s.dims[d].is_known() && s.dims[d].value == 1)
      continue;
    if (d < last) r.contiguous = false;
    last = d;
  }
  return r;
}
// Expand: stride 0 along broadcast dims; the input's own layout when nothing is broadcast.
std::optional<AliasRule> expand(const Graph& g, const Node& n, int out, const Layouts& l) {
  AliasRule r = same_layout(n, 0, l);
  if (!same_shape(g, n.inputs[0], n.outputs[out])) r.contiguous = r.whole = false;
  return r;
}
// A part cut along `axes` (step 1 unless `steps` say otherwise): contiguous only along axis 0.
AliasRule part(const Node& n, const std::vector<int64_t>& axes, bool unit_steps, const Layouts& l) {
  AliasRule r = same_layout(n, 0, l);
  r.whole = false;
  r.contiguous = r.contiguous && unit_steps && !axes.empty() &&
                 std::all_of(axes.begin(), axes.end(), [](int64_t a) { return a == 0; });
  return r;
}
// Slice: a view, except a negative step (at::flip copies).
std::optional<AliasRule> slice(const Graph& g, const Node& n, int, const Layouts& l) {
  auto steps = constant_values(n, 4, l);
  if (steps && std::any_of(steps->begin(), steps->end(), [](double s) { return s < 0; }))
    return std::nullopt;
  const bool unit = !has(n, 4) || (steps && std::all_of(steps->begin(), steps->end(),
                                                        [](double s) { return s == 1; }));
  std::vector<int64_t> axes;
  const int64_t rank = g.value(n.inputs[0]).shape.rank();
  if (n.attrs.has("starts")) {  // before opset 10: attributes
    axes = n.attrs.get_ints("axes", {});
    if (axes.empty())
      for (size_t i = 0; i < n.attrs.get_ints("starts", {}).size(); ++i) axes.push_back(i);
  } else if (has(n, 3)) {
    auto a = constant_values(n, 3, l);
    if (a)
      for (double x : *a) axes.push_back(static_cast<int64_t>(x));
  } else if (auto starts = constant_values(n, 1, l)) {
    for (size_t i = 0; i < starts->size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  for (int64_t& a : axes)
    if (a < 0) a += rank;
  return part(n, axes, unit, l);
}
// Split / ConcatGrad: narrow views along attribute `axis`.
std::optional<AliasRule> split(const Graph& g, const Node& n, int, const Layouts& l) {
  int64_t axis = n.attrs.get_int("axis", 0);
  if (axis < 0) axis += g.value(n.inputs[0]).shape.rank();
  AliasRule r = part(n, {axis}, true, l);
  if (n.outputs.size() == 1) r.whole = l[n.inputs[0]].whole;  // one part: all of it
  return r;
}
std::optional<AliasRule> same_dtype(const Graph& g, const Node& n, int out, const Layouts& l) {
  if (g.value(n.outputs[out]).dtype != g.value(n.inputs[0]).dtype) return std::nullopt;
  return same_layout(n, 0, l);
}
std::optional<AliasRule> dropout(const Graph&, const Node& n, int out, const Layouts& l) {
  if (out != 0 || !dropout_passes_through(n, 1, 2, l)) return std::nullopt;
  return same_layout(n, 0, l);
}
// BiasDropout(X, bias?, residual?, ratio, training_mode): X itself when it adds nothing.
std::optional<AliasRule> bias_dropout(const Graph&, const Node& n, int out, const Layouts& l) {
  if (out != 0 || has(n, 1) || has(n, 2) || !dropout_passes_through(n, 3, 4, l)) return std::nullopt;
  return same_layout(n, 0, l);
}
// DropoutGrad(dY, mask, ratio, training_mode): dY when the forward passed X through.
std::optional<AliasRule> dropout_grad(const Graph&, const Node& n, int, const Layouts& l) {
  if (!dropout_passes_through(n, 2, 3, l)) return std::nullopt;
  return same_layout(n, 0, l);
}
// dY itself when nothing is reduced (provably the same shape).
std::optional<AliasRule> if_same_shape(const Graph& g, const Node& n, int out, const Layouts& l) {
  if (!same_shape(g, n.inputs[0], n.outputs[out])) return std::nullopt;
  return same_layout(n, 0, l);
}
// ReduceSum/ReduceMean with noop_with_empty_axes and no axes: X itself.
std::optional<AliasRule> reduce(const Graph&, const Node& n, int, const Layouts& l) {
  if (!n.attrs.get_int("noop_with_empty_axes", 0) || has(n, 1) || n.attrs.has("axes"))
    return std::nullopt;
  return same_layout(n, 0, l);
}
std::optional<AliasRule> single_sum(const Graph&, const Node& n, int, const Layouts& l) {
  if (n.inputs.size() != 1 || !has(n, 0)) return std::nullopt;
  return same_layout(n, 0, l);
}
// ATenOp/PythonOp (aten_op.h): outputs [n, 2n) share results [0, n); [2n, 2n+m) are the inputs,
// detached.
std::optional<AliasRule> autograd_op(const Graph&, const Node& n, int out, const Layouts& l) {
  const int64_t k = n.attrs.get_int("num_results", -1);
  if (k < 0 || out < k) return std::nullopt;
  if (out < 2 * k) {
    const ValueId result = n.outputs[out - k];
    if (result == kNoValue) return std::nullopt;
    return AliasRule{static_cast<int>(out - k), true, l[result].contiguous, l[result].whole};
  }
  if (!has(n, static_cast<int>(out - 2 * k))) return std::nullopt;
  return same_layout(n, static_cast<int>(out - 2 * k), l);
}

// One line per op whose kernel may return a view; every other op allocates its outputs.
const std::map<std::pair<std::string, std::string>, Rule>& alias_table() {
  static const std::map<std::pair<std::string, std::string>, Rule> table = {
      {{"", "Identity"}, view_of_input0},
      {{"", "Reshape"}, reshape},
      {{"", "Flatten"}, reshape},
      {{"", "Squeeze"}, view_of_input0},
      {{"", "Unsqueeze"}, view_of_input0},
      {{"", "Transpose"}, transpose},
      {{"", "Expand"}, expand},
      {{"", "Slice"}, slice},
      {{"", "Split"}, split},
      {{kOurDomain, "ConcatGrad"}, split},
      {{"", "Cast"}, same_dtype},
      {{"", "CastLike"}, same_dtype},
      {{"", "Dropout"}, dropout},
      {{kOurDomain, "BiasDropout"}, bias_dropout},
      {{kOurDomain, "DropoutGrad"}, dropout_grad},
      {{kOurDomain, "SumToShape"}, if_same_shape},
      {{kOurDomain, "ReduceSumGrad"}, expand},  // unsqueeze + expand of dY
      {{"", "ReduceSum"}, reduce},
      {{"", "ReduceMean"}, reduce},
      {{"", "Sum"}, single_sum},
      {{kOurDomain, kAtenOp}, autograd_op},
      {{kOurDomain, kPythonOp}, autograd_op},
  };
  return table;
}

bool is_constant_node(const Node& n) {
  return n.op_type == "Constant" && n.domain.empty() && n.inputs.empty();
}

}  // namespace

std::optional<AliasRule> alias_rule(const Graph& g, const Node& n, int output,
                                    const std::vector<ValueLayout>& layout) {
  const auto& table = alias_table();
  auto it = table.find({n.domain == "ai.onnx" ? "" : n.domain, n.op_type});
  if (it == table.end() || output < 0 || output >= static_cast<int>(n.outputs.size()) ||
      n.outputs[output] == kNoValue)
    return std::nullopt;
  // Rules other than ATenOp's read input 0 or the rule's own input.
  if (!it->second || (!has(n, 0) && !is_autograd_op(n))) return std::nullopt;
  return it->second(g, n, output, layout);
}

std::vector<ValueLayout> value_layouts(const Graph& g) {
  std::vector<ValueLayout> l(g.num_values());
  for (ValueId v = 0; v < g.num_values(); ++v) l[v].base = v;
  for (const auto& [v, data] : g.initializers) {
    l[v].constant = true;
    l[v].data = &data;
  }
  for (const Node& n : g.nodes) {
    if (is_constant_node(n)) {
      if (!n.outputs.empty() && n.outputs[0] != kNoValue) {
        l[n.outputs[0]].constant = true;
        l[n.outputs[0]].data = n.attrs.get_tensor("value");
      }
      continue;
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const ValueId v = n.outputs[k];
      if (v == kNoValue) continue;
      const auto rule = alias_rule(g, n, static_cast<int>(k), l);
      if (!rule) continue;
      const ValueId src = rule->of_output ? n.outputs[rule->input] : n.inputs[rule->input];
      l[v].base = l[src].base;
      l[v].contiguous = rule->contiguous;
      l[v].whole = rule->whole;
      l[v].constant = l[src].constant;
    }
  }
  return l;
}

std::vector<int> inplace_candidates(const Graph& g, const Node& n) {
  if (!(n.domain.empty() || n.domain == "ai.onnx") || n.outputs.empty() ||
      n.outputs[0] == kNoValue)
    return {};
  std::vector<int> ops;
  if (n.op_type == "Add" || n.op_type == "Mul") ops = {0, 1};
  else if ((n.op_type == "Sub" || n.op_type == "Div") && n.inputs.size() == 2) ops = {0};
  else if (n.op_type == "Sum" && n.inputs.size() > 1) ops = {0};  // the kernel sums into operand 0
  const Value& out = g.value(n.outputs[0]);
  if (!is_floating(out.dtype)) return {};
  std::vector<int> out_ops;
  for (int i : ops) {
    if (!has(n, i)) continue;
    const Value& in = g.value(n.inputs[i]);
    if (in.dtype == out.dtype && in.shape.same_as(out.shape)) out_ops.push_back(i);
  }
  return out_ops;
}

void choose_inplace(const Graph& g, std::vector<Step>& steps, const std::vector<char>& pinned) {
  const std::vector<ValueLayout> l = value_layouts(g);
  // Per buffer (base value): the last step where a value living in it is freed, or -1 when one
  // of them must outlive the phase (pinned, constant).
  std::vector<int64_t> dies(g.num_values(), -2);  // -2: nothing freed yet
  for (size_t s = 0; s < steps.size(); ++s)
    for (ValueId v : steps[s].free_after) {
      int64_t& d = dies[l[v].base];
      if (d != -1) d = std::max<int64_t>(d, static_cast<int64_t>(s));
    }
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (pinned[v] || l[v].constant) dies[l[v].base] = -1;
  for (size_t s = 0; s < steps.size(); ++s) {
    const Node& n = g.nodes[steps[s].node];
    for (int c : inplace_candidates(g, n)) {
      const ValueId x = n.inputs[c];
      const ValueId base = l[x].base;
      bool shared = false;  // another operand reads the same buffer (Add(x, x))
      for (size_t j = 0; j < n.inputs.size(); ++j)
        if (static_cast<int>(j) != c && n.inputs[j] != kNoValue && l[n.inputs[j]].base == base)
          shared = true;
      if (dies[base] == static_cast<int64_t>(s) && l[x].contiguous && l[x].whole && !shared) {
        steps[s].inplace = c;
        break;
      }
    }
  }
}

}  // namespace torch_ort
