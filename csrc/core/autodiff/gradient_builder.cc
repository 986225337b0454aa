// Reverse-mode autodiff: walks the forward graph backwards, calls one registered rule per node,
// sums fan-out gradients, and appends the backward nodes after the forward ones.
#include "csrc/core/autodiff/gradient_builder.h"

#include <algorithm>
#include <map>
#include <set>

#include "csrc/core/ir/aten_op.h"
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/op_traits.h"

namespace torch_ort {
namespace {

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Some gradients need a forward output the exporter left out; the op's family file says which
// and adds it (OpTraits::add_outputs_for_gradient: MaxPool's Indices, Dropout's mask,
// LayerNormalization's statistics, the losses' log-probabilities). ATenOp, PythonOp: autograd's
// state (results with their history, leaf inputs), see aten_op.h.
void request_forward_outputs(Graph& g) {
  for (Node& n : g.nodes) {
    if (is_autograd_op(n)) request_aten_autograd_outputs(g, n);
    const auto add = op_traits(n).add_outputs_for_gradient;
    if (!add) continue;
    // The added outputs are named after output 0 and shaped from input 0 (a malformed model may
    // omit either: fuzzer, LayerNormalization with no X).
    if (n.inputs.empty() || n.inputs[0] == kNoValue || n.outputs.empty() || n.outputs[0] == kNoValue)
      throw GradientError(n.describe() + " has no input 0 or no output 0; its gradient needs both");
    add(g, n);
  }
}

// Gather's gradients of one value add into one buffer: each GatherGrad (or EmbeddingGrad) takes the previous
// contribution as its accumulator (input 3, which the plan lets it overwrite) instead of zeros of
// its own and a Sum over all of them. A loop that reads rows of a weight by index (the eager
// experts loop: one Gather per expert and layer) would otherwise fill and add the whole weight's
// gradient once per read; a tied embedding's gradient adds into the LM head's instead of a
// vocabulary-wide zero fill and sum. The chain starts from another contribution of the same type
// made before the first GatherGrad, if there is one. Returns the parts left to sum (the chain's
// result among them).
std::vector<ValueId> chain_scatter_backs(BuilderState& st, const std::vector<ValueId>& parts) {
  if (parts.size() < 2) return parts;
  std::vector<size_t> chain;          // positions in st.backward of the GatherGrads making parts
  std::map<ValueId, size_t> made_at;  // parts made by a backward node: its position
  for (ValueId p : parts)
    for (size_t i = st.backward.size(); i-- > 0;) {
      const Node& n = st.backward[i];
      if (n.outputs.size() != 1 || n.outputs[0] != p) continue;
      made_at[p] = i;
      if (n.domain == kOurDomain && (n.op_type == "GatherGrad" || n.op_type == "EmbeddingGrad") &&
          n.inputs.size() == 3)
        chain.push_back(i);
      break;
    }
  if (chain.empty()) return parts;
  std::sort(chain.begin(), chain.end());
  const Value& out = st.g.value(st.backward[chain[0]].outputs[0]);
  ValueId acc = kNoValue;
  for (ValueId p : parts) {
    const auto it = made_at.find(p);
    const Value& v = st.g.value(p);
    if (it != made_at.end() && it->second < chain[0] && v.dtype == out.dtype && v.shape.same_as(out.shape)) {
      acc = p;
      break;
    }
  }
  std::set<ValueId> chained;
  if (acc != kNoValue) chained.insert(acc);
  for (size_t i : chain) chained.insert(st.backward[i].outputs[0]);
  if (chained.size() < 2) return parts;
  for (const Node& n : st.backward)  // each chained part must be read by the sum alone
    for (ValueId in : n.inputs)
      if (chained.count(in)) return parts;
  for (size_t i : chain) {
    if (acc != kNoValue) st.backward[i].inputs.push_back(acc);
    acc = st.backward[i].outputs[0];
  }
  std::vector<ValueId> rest;
  for (ValueId p : parts)
    if (!chained.count(p)) rest.push_back(p);
  rest.push_back(acc);
  return rest;
}

// Sums gradient contributions of one value (fan-out); one contribution passes through.
ValueId accumulate(BuilderState& st, const std::vector<ValueId>& all_parts, ValueId like) {
  if (all_parts.empty()) return kNoValue;
  const std::vector<ValueId> parts = chain_scatter_backs(st, all_parts);
  if (parts.size() == 1) return parts[0];
  const Value v = st.g.value(like);  // a copy: new_value may grow the value table
  ValueId out = st.g.new_value(v.name + "_grad/accumulated", st.g.value(parts[0]).dtype, v.shape);
  st.backward.push_back(Node{"", "Sum", st.g.unique_node_name(v.name + "_grad/Sum"), parts, {out}, {}});
  return out;
}

// Marks the values whose gradient is wanted: float values downstream of a requires-grad input
// through differentiable edges.
std::vector<char> requires_grad(const Graph& g, const std::vector<bool>& input_requires_grad) {
  std::vector<char> req(g.num_values(), 0);
  for (size_t i = 0; i < g.inputs.size(); ++i)
    if (input_requires_grad[i] && is_floating(g.value(g.inputs[i]).dtype)) req[g.inputs[i]] = 1;
  const auto& reg = GradientRegistry::instance();
  for (const Node& n : g.nodes) {
    const GradientEntry* e = reg.find(n.domain, n.op_type);
    if (e && !e->rule) continue;  // NO_GRADIENT: outputs carry no gradient
    bool any = false;
    for (int i = 0; i < static_cast<int>(n.inputs.size()); ++i)
      any |= n.inputs[i] != kNoValue && req[n.inputs[i]] && !(e && contains(e->non_differentiable, i));
    for (ValueId o : n.outputs)
      if (o != kNoValue && any && is_floating(g.value(o).dtype)) req[o] = 1;
  }
  return req;
}

}  // namespace

TrainingGraph build_training_graph(const Graph& forward, const std::vector<bool>& input_requires_grad) {
  if (input_requires_grad.size() != forward.inputs.size())
    throw GradientError("build_training_graph: " + std::to_string(input_requires_grad.size()) +
                        " requires-grad flags for " + std::to_string(forward.inputs.size()) + " inputs");
  TrainingGraph tg;
  tg.graph = forward;
  Graph& g = tg.graph;
  request_forward_outputs(g);
  const std::vector<char> req = requires_grad(g, input_requires_grad);

  BuilderState st(g);
  std::map<ValueId, std::vector<ValueId>> contrib;  // value -> gradient contributions so far
  for (ValueId o : g.outputs) {
    if (!req[o]) { tg.grad_of_outputs.push_back(kNoValue); continue; }
    const Value& ov = g.value(o);
    ValueId gv = g.new_value("grad_" + ov.name, ov.dtype, ov.shape);
    tg.grad_of_outputs.push_back(gv);
    contrib[o].push_back(gv);
  }

  const auto& reg = GradientRegistry::instance();
  const std::vector<Node> fwd_nodes = g.nodes;  // rules add values to g, never nodes
  std::vector<std::string> missing;             // ops without a rule on a gradient path
  std::vector<UnsupportedNode> missing_nodes;   // the same, as data (GradientError::nodes)
  for (auto it = fwd_nodes.rbegin(); it != fwd_nodes.rend(); ++it) {
    const Node& n = *it;
    std::vector<ValueId> gys;
    bool any_grad = false;
    for (ValueId o : n.outputs) {
      auto c = contrib.find(o);
      gys.push_back(o != kNoValue && c != contrib.end() ? accumulate(st, c->second, o) : kNoValue);
      any_grad |= gys.back() != kNoValue;
    }
    if (!any_grad) continue;
    const GradientEntry* e = reg.find(n.domain, n.op_type);
    if (!e) {  // keep going: one error naming every such node (the ATen fallback reroutes them all)
      missing.push_back("'" + n.op_type + "' (node " + n.name + ")");
      missing_nodes.push_back({n.name, n.domain, n.op_type, "gradient rule"});
      continue;
    }
    if (!e->rule) continue;
    std::vector<bool> needs(n.inputs.size(), false);
    bool any_need = false;
    for (int i = 0; i < static_cast<int>(n.inputs.size()); ++i) {
      needs[i] = n.inputs[i] != kNoValue && req[n.inputs[i]] && !contains(e->non_differentiable, i);
      any_need |= needs[i];
    }
    if (!any_need) continue;
    GradCtx ctx(st, n, gys, needs);
    const std::vector<UnsupportedNode> this_node{{n.name, n.domain, n.op_type, "working gradient rule"}};
    try {
      e->rule(ctx);
    } catch (const GradientError& err) {  // the rule refused this node: same text, the node as data
      if (!err.nodes.empty()) throw;
      throw GradientError(err.what(), this_node);
    } catch (const std::invalid_argument& err) {
      // A malformed node from a model file: an attribute of the wrong kind, a constant input
      // that is not an integer tensor (attribute.cc's accessors). Name the node.
      throw GradientError("Gradient rule of " + n.describe() + ": " + err.what());
    } catch (const std::overflow_error& err) {  // checked size arithmetic (limits.h)
      throw GradientError("Gradient rule of " + n.describe() + ": " + err.what());
    }
    for (int i = 0; i < static_cast<int>(needs.size()); ++i) {
      if (!needs[i]) continue;
      auto gi = ctx.grads.find(i);
      if (gi == ctx.grads.end())
        throw GradientError("Gradient rule of " + n.describe() + " produced no gradient for input " +
                            std::to_string(i) + " ('" + g.value(n.inputs[i]).name + "')", this_node);
      contrib[n.inputs[i]].push_back(gi->second);
    }
  }

  if (!missing.empty()) {
    std::string msg = "No gradient rule for op " + missing[0];
    for (size_t i = 1; i < missing.size(); ++i) msg += (i == 1 ? " (and also " : ", ") + missing[i];
    throw GradientError(msg + (missing.size() > 1 ? ")" : "") +
                        " on the path from a trainable input to the loss; add one with "
                        "REGISTER_GRADIENT or set ORTMODULE_FALLBACK_POLICY to fall back to PyTorch",
                        std::move(missing_nodes));
  }
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    ValueId in = g.inputs[i];
    auto c = contrib.find(in);
    tg.input_grads.push_back(req[in] && c != contrib.end() ? accumulate(st, c->second, in) : kNoValue);
  }

  // Forward nodes, then the Shape nodes backward reads (cheap, run while forward values live),
  // then backward in emission order (already a valid topological order).
  tg.num_forward_nodes = fwd_nodes.size() + st.forward_side.size();
  g.nodes.insert(g.nodes.end(), st.forward_side.begin(), st.forward_side.end());
  g.nodes.insert(g.nodes.end(), st.backward.begin(), st.backward.end());
  return tg;
}

}  // namespace torch_ort
