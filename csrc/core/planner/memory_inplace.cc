// In-place reuse: which operands a step may overwrite (its op's inplace_inputs: the elementwise
// kernels of kernels/elementwise.cc, GatherGrad's accumulator), and the plan's choice per step
// (see memory.h).
#include <algorithm>

#include "csrc/core/ir/op_traits.h"
#include "csrc/core/planner/memory.h"

namespace torch_ort {

std::vector<int> inplace_candidates(const Graph& g, const Node& n) {
  // The operands the op's kernel may overwrite (its inplace_inputs trait, ops/elementwise.cc),
  // with two or more operands: a lone Sum operand passes through (a view, memory_layout.cc).
  const std::vector<int>& ops = op_traits(n).inplace_inputs;
  if (ops.empty() || n.inputs.size() < 2 || n.outputs.empty() || n.outputs[0] == kNoValue) return {};
  const Value& out = g.value(n.outputs[0]);
  if (!is_floating(out.dtype)) return {};
  std::vector<int> out_ops;
  for (int i : ops) {
    if (i >= static_cast<int>(n.inputs.size()) || n.inputs[i] == kNoValue) continue;
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
