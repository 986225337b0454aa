// Views: which buffer each value lives in, as our runtime kernels lay it out (see memory.h).
//
// One rule per kind of the ops' `view` trait (csrc/core/ops/), following csrc/runtime/kernels:
// shape.cc (Reshape/Flatten via at::reshape, Transpose via permute,
// Squeeze/Unsqueeze/Expand), shape_slice.cc (Slice, Split, ConcatGrad narrow),
// elementwise.cc (Identity, Cast to its own dtype, Dropout in inference, single-operand Sum),
// grad_ops.cc, reduce.cc, elementwise_compare.cc, random_bias_dropout.cc and aten_fallback.cc
// (detached leaves).
//
// Views carry symbolic strides, so that a Reshape is decided as at::reshape decides it: a view
// when the strides allow one (ATen's computeStride, with provable equality of products), else a
// copy — a Split piece along the last axis reshaped to [B, T, H, D] is a view, a transposed
// [B, T, H, D] reshaped to [B, T, C] is a copy. Approximations, each on the side of "copy":
//   - a product that is not provably equal (unknown dims, a symbol that is 1 at run time)
//     ends a chunk; strides are unknown past an op without a stride rule.
//   - graph inputs are taken as contiguous (a caller's transposed tensor would make Reshape copy).
//   - Slice/Split/ConcatGrad views never cover their whole buffer (in-place reuse skips them).
//   - pass-throughs decided at run time (Dropout's training_mode or ratio not constant) are
//     taken as new buffers; Sum passes an operand through when the others are absent output
//     gradients (autograd's None, per call): not modelled.
//   - fused attention: Y and dQ/dK/dV are laid out like Q/K/V (CPU flash attention's empty_like;
//     CUDA's memory-efficient kernel always gives (B, L, H, D) storage — the same for the usual
//     transposed Q, not for a contiguous one, where the CUDA Reshape after it is a view).
//   - a kernel returning a view of its own larger scratch (Conv's crop, attention's narrowed
//     statistics) is counted at the value's bytes, not the scratch's.
#include <algorithm>
#include <stdexcept>

#include "csrc/core/ir/op_traits.h"
#include "csrc/core/planner/memory.h"
#include "csrc/core/planner/strides.h"

namespace torch_ort {
namespace {

using Layouts = std::vector<ValueLayout>;
using Rule = std::optional<AliasRule> (*)(const Graph&, const Node&, int, const Layouts&);

// --- Constants the rules read.
bool has(const Node& n, int i) {
  return i >= 0 && i < static_cast<int>(n.inputs.size()) && n.inputs[i] != kNoValue;
}
// Values of constant input `i` through a TensorData reader (as_doubles: any numeric dtype;
// as_int64s: int32/int64 exactly, for axes, steps and starts, whose values past 2^53 a double
// would round), or nullopt when the input is absent, not constant or of another dtype.
template <typename T>
std::optional<std::vector<T>> constant_as(const Node& n, int i, const Layouts& l,
                                          std::vector<T> (TensorData::*read)() const) {
  if (!has(n, i) || !l[n.inputs[i]].data) return std::nullopt;
  try {
    return (l[n.inputs[i]].data->*read)();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}
std::optional<std::vector<int64_t>> constant_ints(const Node& n, int i, const Layouts& l) {
  return constant_as(n, i, l, &TensorData::as_int64s);
}
bool constant_is(const Node& n, int i, const Layouts& l, double v) {
  auto d = constant_as(n, i, l, &TensorData::as_doubles);
  return d && d->size() == 1 && (*d)[0] == v;
}
// Axes from input `i` (constant) or attribute "axes", made non-negative for `rank`.
std::optional<std::vector<int64_t>> axes_of(const Node& n, int i, const Layouts& l, int64_t rank) {
  std::vector<int64_t> axes;
  if (has(n, i)) {
    auto a = constant_ints(n, i, l);
    if (!a) return std::nullopt;
    axes = std::move(*a);
  } else {
    axes = n.attrs.get_ints("axes", {});
  }
  for (int64_t& a : axes) a = a < 0 && rank >= 0 ? a + rank : a;  // no overflow: rank <= 64
  return axes;
}
// Dropout's kernels pass X (or dY) through when training_mode is absent or false, or ratio is 0.
bool dropout_passes_through(const Node& n, int ratio, int training, const Layouts& l) {
  return !has(n, training) || constant_is(n, training, l, 0.0) || constant_is(n, ratio, l, 0.0);
}

// --- The rules.
// The view keeps the layout of input `i`.
AliasRule same_layout(const Node& n, int i, const Layouts& l) {
  const ValueLayout& in = l[n.inputs[i]];
  return AliasRule{i, false, in.contiguous, in.whole, in.strides};
}
bool same_shape(const Graph& g, ValueId a, ValueId b) {
  return g.value(a).shape.same_as(g.value(b).shape);
}
std::optional<AliasRule> view_of_input0(const Graph&, const Node& n, int, const Layouts& l) {
  return same_layout(n, 0, l);
}
// at::reshape (Reshape, Flatten): a view when the input's strides allow one, else a copy.
std::optional<AliasRule> reshape(const Graph& g, const Node& n, int out, const Layouts& l) {
  const ValueLayout& in = l[n.inputs[0]];
  AliasRule r = same_layout(n, 0, l);
  const auto shape = sizes_of(g, n.outputs[out]);
  if (in.contiguous) {
    r.strides = shape ? std::optional<SymSizes>(row_major(*shape)) : std::nullopt;
    return r;
  }
  const auto old_sizes = sizes_of(g, n.inputs[0]);
  if (!shape || !old_sizes || !in.strides) return std::nullopt;
  r.strides = view_strides(*old_sizes, *in.strides, *shape);
  if (!r.strides) return std::nullopt;
  return r;
}
// permute.
std::optional<AliasRule> transpose(const Graph& g, const Node& n, int, const Layouts& l) {
  AliasRule r = same_layout(n, 0, l);
  const int64_t rank = g.value(n.inputs[0]).shape.rank();
  std::vector<int64_t> perm = n.attrs.get_ints("perm", {});
  if (perm.empty())
    for (int64_t d = rank - 1; d >= 0; --d) perm.push_back(d);  // default: reverse
  if (!r.strides || static_cast<int64_t>(perm.size()) != rank) {
    r.contiguous = false;
    r.strides.reset();
    return r;
  }
  SymSizes st;
  for (int64_t d : perm) {
    if (d < 0 || d >= rank) {  // not a permutation: the shape rule reports it; no layout here
      r.contiguous = false;
      r.strides.reset();
      return r;
    }
    st.push_back((*r.strides)[d]);
  }
  r.strides = st;
  return r;
}
// Expand: stride 0 along broadcast dims (and new leading ones).
std::optional<AliasRule> expand(const Graph& g, const Node& n, int out, const Layouts& l) {
  AliasRule r = same_layout(n, 0, l);
  if (same_shape(g, n.inputs[0], n.outputs[out])) return r;
  r.contiguous = r.whole = false;
  r.strides.reset();
  const auto in = sizes_of(g, n.inputs[0]), to = sizes_of(g, n.outputs[out]);
  const ValueLayout& src = l[n.inputs[0]];
  if (!in || !to || !src.strides || to->size() < in->size()) return r;
  SymSizes st(to->size(), SymExpr::constant(0));
  for (size_t k = 0; k < in->size(); ++k) {
    const size_t o = to->size() - in->size() + k;
    if (same_expr((*in)[k], (*to)[o])) st[o] = (*src.strides)[k];
    else if (!is_one((*in)[k])) return r;  // not provably a broadcast
  }
  r.strides = st;
  return r;
}
// Squeeze / Unsqueeze: drop or insert size-1 dims (strides as ATen gives them).
std::optional<AliasRule> squeeze(const Graph& g, const Node& n, int out, const Layouts& l) {
  AliasRule r = same_layout(n, 0, l);
  const auto in = sizes_of(g, n.inputs[0]);
  const auto axes = axes_of(n, 1, l, in ? static_cast<int64_t>(in->size()) : 0);
  r.strides.reset();
  if (!in || !axes || !l[n.inputs[0]].strides) return r;
  SymSizes st;
  for (size_t k = 0; k < in->size(); ++k) {
    const bool dropped = axes->empty() ? is_one((*in)[k])
                                       : std::count(axes->begin(), axes->end(), k) > 0;
    if (!dropped) st.push_back((*l[n.inputs[0]].strides)[k]);
  }
  if (st.size() == g.value(n.outputs[out]).shape.dims.size()) r.strides = st;
  return r;
}
std::optional<AliasRule> unsqueeze(const Graph& g, const Node& n, int out, const Layouts& l) {
  AliasRule r = same_layout(n, 0, l);
  const auto sizes = sizes_of(g, n.inputs[0]);
  const int64_t rank = g.value(n.outputs[out]).shape.rank();
  auto axes = axes_of(n, 1, l, rank);
  r.strides.reset();
  if (!sizes || !axes || !l[n.inputs[0]].strides) return r;
  std::sort(axes->begin(), axes->end());
  SymSizes sz = *sizes, st = *l[n.inputs[0]].strides;
  for (int64_t a : *axes) {  // at::unsqueeze: stride = size·stride of the dim it precedes
    if (a < 0 || a > static_cast<int64_t>(sz.size())) return r;
    SymExpr s = SymExpr::constant(1);
    try {
      if (a < static_cast<int64_t>(sz.size())) s = sz[a] * st[a];
    } catch (const std::overflow_error&) {  // checked arithmetic (sym_dim.cc): layout unknown
      return r;
    }
    sz.insert(sz.begin() + a, SymExpr::constant(1));
    st.insert(st.begin() + a, s);
  }
  r.strides = st;
  return r;
}
// A part cut along `axes` with `steps` (Slice, Split, ConcatGrad; nullopt: axes or steps not
// constant): never its whole buffer.
AliasRule part(const Node& n, const std::optional<std::vector<int64_t>>& axes,
               const std::vector<int64_t>& steps, const Layouts& l) {
  AliasRule r = same_layout(n, 0, l);
  r.whole = false;
  const auto unknown = [&] {
    r.strides.reset();
    r.contiguous = false;
    return r;
  };
  if (!axes || !r.strides) return unknown();
  for (size_t i = 0; i < axes->size(); ++i) {
    const int64_t a = (*axes)[i];
    if (a < 0 || a >= static_cast<int64_t>(r.strides->size())) return unknown();
    if (i < steps.size() && steps[i] != 1) {
      try {
        (*r.strides)[a] = (*r.strides)[a] * SymExpr::constant(steps[i]);
      } catch (const std::overflow_error&) {  // checked arithmetic (sym_dim.cc)
        return unknown();
      }
    }
  }
  return r;
}
// Slice: a view, except a negative step (at::flip copies).
std::optional<AliasRule> slice(const Graph& g, const Node& n, int, const Layouts& l) {
  const int64_t rank = g.value(n.inputs[0]).shape.rank();
  std::vector<int64_t> axes;
  std::vector<int64_t> steps;
  if (n.attrs.has("starts")) {  // before opset 10: attributes, step 1
    axes = n.attrs.get_ints("axes", {});
    if (axes.empty())
      for (size_t i = 0; i < n.attrs.get_ints("starts", {}).size(); ++i) axes.push_back(i);
  } else {
    auto st = constant_ints(n, 4, l);
    auto starts = constant_ints(n, 1, l);
    auto a = axes_of(n, 3, l, rank);
    if (has(n, 4) && !st) return part(n, std::nullopt, {}, l);
    if (st) steps = *st;
    if (has(n, 3) && a) axes = *a;
    else if (!has(n, 3) && starts)
      for (size_t i = 0; i < starts->size(); ++i) axes.push_back(static_cast<int64_t>(i));
    else return part(n, std::nullopt, {}, l);
  }
  if (std::any_of(steps.begin(), steps.end(), [](int64_t s) { return s < 0; })) return std::nullopt;
  for (int64_t& a : axes) a = a < 0 ? a + rank : a;
  return part(n, axes, steps, l);
}
// Split / ConcatGrad: narrow views along attribute `axis`.
std::optional<AliasRule> split(const Graph& g, const Node& n, int, const Layouts& l) {
  int64_t axis = n.attrs.get_int("axis", 0);
  if (axis < 0) axis += g.value(n.inputs[0]).shape.rank();
  AliasRule r = part(n, std::vector<int64_t>{axis}, {}, l);
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
// SumToShape: dY itself when nothing is reduced (provably the same shape).
std::optional<AliasRule> if_same_shape(const Graph& g, const Node& n, int out, const Layouts& l) {
  if (!same_shape(g, n.inputs[0], n.outputs[out])) return std::nullopt;
  return same_layout(n, 0, l);
}
// ReduceSumGrad: unsqueeze + expand of dY, always a view.
std::optional<AliasRule> spread(const Graph& g, const Node& n, int out, const Layouts& l) {
  AliasRule r = same_layout(n, 0, l);
  if (same_shape(g, n.inputs[0], n.outputs[out])) return r;
  r.contiguous = r.whole = false;
  r.strides.reset();
  return r;
}
// ReduceSum/ReduceMean with noop_with_empty_axes and no axes: X itself.
std::optional<AliasRule> reduce(const Graph&, const Node& n, int, const Layouts& l) {
  if (!n.attrs.get_int("noop_with_empty_axes", 0) || has(n, 1) || n.attrs.has("axes"))
    return std::nullopt;
  return same_layout(n, 0, l);
}
std::optional<AliasRule> single_sum(const Graph&, const Node& n, int, const Layouts& l) {
  if (n.inputs.size() != 1) return std::nullopt;
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
    const ValueLayout& src = l[result];
    return AliasRule{static_cast<int>(out - k), true, src.contiguous, src.whole, src.strides};
  }
  if (!has(n, static_cast<int>(out - 2 * k))) return std::nullopt;
  return same_layout(n, static_cast<int>(out - 2 * k), l);
}

// The rule for each kind of view (the op's `view` trait, ops/<family>.cc: one line per op whose
// kernel may return a view; every other op allocates its outputs).
Rule rule_for(ViewRule kind) {
  switch (kind) {
    case ViewRule::kNever: return nullptr;
    case ViewRule::kInput0: return view_of_input0;
    case ViewRule::kReshape: return reshape;
    case ViewRule::kSqueeze: return squeeze;
    case ViewRule::kUnsqueeze: return unsqueeze;
    case ViewRule::kTranspose: return transpose;
    case ViewRule::kExpand: return expand;
    case ViewRule::kSlice: return slice;
    case ViewRule::kSplit: return split;
    case ViewRule::kSameDtype: return same_dtype;
    case ViewRule::kDropout: return dropout;
    case ViewRule::kBiasDropout: return bias_dropout;
    case ViewRule::kDropoutGrad: return dropout_grad;
    case ViewRule::kIfSameShape: return if_same_shape;
    case ViewRule::kSpread: return spread;
    case ViewRule::kReduceNoop: return reduce;
    case ViewRule::kSingleSum: return single_sum;
    case ViewRule::kAutogradOp: return autograd_op;
  }
  return nullptr;
}

// --- New buffers that are not row-major: a kernel that allocates an output empty_like one of its
// inputs (the op's output_like_input hook: ATen's fused attention gives Y the layout of Q, so a Q
// transposed from (B, T, H, D) gives a Y whose transpose back is contiguous and reshapes as a view).
std::optional<SymSizes> fresh_strides(const Graph& g, const Node& n, int output, const Layouts& l) {
  const OpTraits& traits = op_traits(n);
  const int input = traits.output_like_input ? traits.output_like_input(g, n, output) : -1;
  if (!has(n, input) || !l[n.inputs[input]].strides) return std::nullopt;
  const auto sizes = sizes_of(g, n.inputs[input]);
  return sizes ? dense_like(*sizes, *l[n.inputs[input]].strides) : std::nullopt;
}


}  // namespace

std::optional<AliasRule> alias_rule(const Graph& g, const Node& n, int output,
                                    const std::vector<ValueLayout>& layout) {
  const ViewRule kind = op_traits(n).view;
  if (kind == ViewRule::kNever || output < 0 || output >= static_cast<int>(n.outputs.size()) ||
      n.outputs[output] == kNoValue)
    return std::nullopt;
  if (!has(n, 0) && kind != ViewRule::kAutogradOp) return std::nullopt;  // the others view input 0
  return rule_for(kind)(g, n, output, layout);
}

std::vector<ValueLayout> value_layouts(const Graph& g) {
  std::vector<ValueLayout> l(g.num_values());
  for (ValueId v = 0; v < g.num_values(); ++v) {
    l[v].base = v;
    if (auto s = sizes_of(g, v)) l[v].strides = row_major(*s);  // new buffers are row-major
  }
  for (const auto& [v, data] : g.initializers) {
    l[v].constant = true;
    l[v].data = &data;
  }
  for (const Node& n : g.nodes) {
    if (is_constant(n)) {
      if (!n.outputs.empty() && n.outputs[0] != kNoValue) {
        l[n.outputs[0]].constant = true;
        l[n.outputs[0]].data = n.attrs.get_tensor("value");
      }
      continue;
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const ValueId v = n.outputs[k];
      if (v == kNoValue) continue;
      auto rule = alias_rule(g, n, static_cast<int>(k), l);
      if (!rule) {
        const auto st = fresh_strides(g, n, static_cast<int>(k), l);
        const auto sizes = sizes_of(g, v);
        if (st && sizes && st->size() == sizes->size()) {
          l[v].contiguous = is_row_major(*st, *sizes);
          l[v].strides = st;
        }
        continue;
      }
      const ValueId src = rule->of_output ? n.outputs[rule->input] : n.inputs[rule->input];
      const auto sizes = sizes_of(g, v);
      l[v].base = l[src].base;
      l[v].whole = rule->whole;
      l[v].constant = l[src].constant;
      l[v].strides = sizes && rule->strides && rule->strides->size() == sizes->size()
                         ? std::move(rule->strides) : std::nullopt;
      l[v].contiguous = l[v].strides ? is_row_major(*l[v].strides, *sizes) : rule->contiguous;
    }
  }
  return l;
}

}  // namespace torch_ort
