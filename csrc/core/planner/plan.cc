// Liveness over the training graph: the saved set (forward values backward reads) and the step
// after which every other buffer is dropped.
#include "csrc/core/planner/plan.h"

#include <algorithm>

#include "csrc/core/planner/memory.h"

namespace torch_ort {
namespace {

// Fills step.free_after for the steps [begin, end) of `nodes`: each value listed in `candidate`
// is freed after the last step that reads it (or right after the step producing it if unread).
std::vector<Step> schedule(const Graph& g, size_t begin, size_t end, const std::vector<char>& keep,
                           std::vector<char> candidate) {
  std::vector<int64_t> last(g.num_values(), -1);
  for (size_t s = begin; s < end; ++s) {
    for (ValueId v : g.nodes[s].outputs)
      if (v != kNoValue) { candidate[v] = 1; last[v] = static_cast<int64_t>(s); }
    for (ValueId v : g.nodes[s].inputs)
      if (v != kNoValue) last[v] = static_cast<int64_t>(s);
  }
  std::vector<Step> steps;
  for (size_t s = begin; s < end; ++s) steps.push_back(Step{static_cast<NodeId>(s), {}});
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (candidate[v] && !keep[v] && last[v] >= 0)
      steps[last[v] - begin].free_after.push_back(v);
  return steps;
}

}  // namespace

Plan plan_training(const TrainingGraph& tg) {
  const Graph& g = tg.graph;
  const size_t nf = tg.num_forward_nodes;
  Plan plan;

  // Values available in forward: graph inputs and forward-node outputs (constants excluded:
  // the engine binds those to every run itself).
  std::vector<char> forward_side(g.num_values(), 0), produced_fwd(g.num_values(), 0);
  for (ValueId v : g.inputs) forward_side[v] = 1;
  for (size_t s = 0; s < nf; ++s)
    for (ValueId v : g.nodes[s].outputs)
      if (v != kNoValue) { forward_side[v] = produced_fwd[v] = 1; ++plan.num_forward_values; }

  // The saved set: forward values that backward reads (or returns as a gradient).
  std::vector<char> saved(g.num_values(), 0);
  for (size_t s = nf; s < g.nodes.size(); ++s)
    for (ValueId v : g.nodes[s].inputs)
      if (v != kNoValue && forward_side[v]) saved[v] = 1;
  for (ValueId v : tg.input_grads)
    if (v != kNoValue && forward_side[v]) saved[v] = 1;
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (saved[v]) {
      plan.saved.push_back(v);
      plan.num_saved_activations += produced_fwd[v];
    }

  // Forward keeps its outputs (returned) and the saved set; everything else dies at last use.
  std::vector<char> keep_fwd = saved;
  for (ValueId v : g.outputs) keep_fwd[v] = 1;
  plan.forward = schedule(g, 0, nf, keep_fwd, std::vector<char>(g.num_values(), 0));

  // Backward keeps the input gradients (returned); saved values and incoming gradients die at
  // their last backward use.
  std::vector<char> keep_bwd(g.num_values(), 0), bwd_candidates = saved;
  for (ValueId v : tg.input_grads)
    if (v != kNoValue) keep_bwd[v] = 1;
  for (ValueId v : tg.grad_of_outputs)
    if (v != kNoValue) bwd_candidates[v] = 1;
  plan.backward = schedule(g, nf, g.nodes.size(), keep_bwd, bwd_candidates);

  // In-place reuse never takes over a buffer that outlives its phase or is not the engine's.
  std::vector<char> pinned = keep_fwd;
  for (ValueId v : g.inputs) pinned[v] = 1;
  for (ValueId v : tg.grad_of_outputs)
    if (v != kNoValue) pinned[v] = 1;
  for (ValueId v : tg.input_grads)
    if (v != kNoValue) pinned[v] = 1;
  choose_inplace(g, plan.forward, pinned);
  choose_inplace(g, plan.backward, pinned);
  return plan;
}

Plan plan_inference(const Graph& g) {
  Plan plan;
  std::vector<char> keep(g.num_values(), 0);
  for (ValueId v : g.outputs) keep[v] = 1;
  plan.forward = schedule(g, 0, g.nodes.size(), keep, std::vector<char>(g.num_values(), 0));
  for (ValueId v : g.inputs) keep[v] = 1;
  choose_inplace(g, plan.forward, keep);  // never over an input or an output
  for (const Node& n : g.nodes)
    for (ValueId v : n.outputs) plan.num_forward_values += v != kNoValue;
  return plan;
}

}  // namespace torch_ort
