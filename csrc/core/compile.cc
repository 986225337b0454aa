#include "csrc/core/compile.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/ir/limits.h"
#include "csrc/core/ir/onnx_io.h"
#include "csrc/core/ir/type_inference.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"
#include "csrc/core/planner/placement.h"
#include "csrc/core/shapes/infer_shapes.h"

namespace torch_ort::core {
namespace {

PipelineOptions pipeline_options(const CompileOptions& options) {
  PipelineOptions po;
  po.verify_after_each = options.verify_after_each_pass;
  const std::vector<std::string> known = pass_names();
  const std::vector<std::string> required = required_pass_names();
  for (const std::string& name : options.disabled_passes) {
    // A misspelt name would silently leave the pass on; say which names exist instead.
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      throw std::invalid_argument("disabled_passes: no pass named '" + name + "' (passes: " + list + ")");
    }
    if (std::find(required.begin(), required.end(), name) != required.end())
      throw std::invalid_argument("disabled_passes: '" + name + "' is a lowering the engine needs " +
                                  "(no kernel or gradient rule handles what it removes); it cannot " +
                                  "be disabled");
    po.disabled.insert(name);
  }
  return po;
}

std::vector<bool> requires_grad(const Graph& g, const CompileOptions& options) {
  if (options.every_float_input_requires_grad) {
    std::vector<bool> out;
    for (ValueId v : g.inputs) out.push_back(is_floating(g.value(v).dtype));
    return out;
  }
  if (options.input_requires_grad.size() != g.inputs.size())
    throw std::invalid_argument("input_requires_grad has " + std::to_string(options.input_requires_grad.size()) +
                                " entries, but the graph has " + std::to_string(g.inputs.size()) + " inputs");
  return options.input_requires_grad;
}

// Removes the outputs at `dropped` (positions in g.outputs), checked: in range, each once.
void drop_outputs(Graph& g, std::vector<int64_t> dropped) {
  if (dropped.empty()) return;
  std::sort(dropped.begin(), dropped.end());
  const int64_t n = static_cast<int64_t>(g.outputs.size());
  for (size_t i = 0; i < dropped.size(); ++i)
    if (dropped[i] < 0 || dropped[i] >= n || (i > 0 && dropped[i] == dropped[i - 1]))
      throw std::invalid_argument("dropped_outputs: " + std::to_string(dropped[i]) +
                                  " is not one of the graph's " + std::to_string(n) + " outputs, or is named twice");
  for (auto it = dropped.rbegin(); it != dropped.rend(); ++it) g.outputs.erase(g.outputs.begin() + *it);
}

// LinearCrossEntropy's chunk of logits (chunk_bytes counts them in float), made in place: one
// chunk when they are float; with a smaller dtype the half-size chunk and its float copy (two, at
// most); with soft-capping also the capped logits and the tanh kept for the gradient (four, at
// most). Plus the float accumulator of dW when the weight is not float.
int64_t kernel_workspace(const Graph& g) {
  int64_t most = 0;
  for (const Node& n : g.nodes) {
    if (n.op_type != "LinearCrossEntropy" || n.domain != kOurDomain) continue;
    const bool from_full = n.inputs.size() > 4 && n.inputs[4] != kNoValue;
    const bool float_chunk = g.value(n.inputs[from_full ? 4 : 0]).dtype == DType::kFloat;
    const int64_t chunks = n.attrs.get_float("softcap", 0.0f) > 0 ? 4 : float_chunk ? 1 : 2;
    // Checked: a model file may hold any attribute or dim (limits.h).
    int64_t bytes = checked_mul(chunks, std::max<int64_t>(0, n.attrs.get_int("chunk_bytes", 0)), "chunk bytes");
    const Value& w = g.value(n.inputs[1]);
    if (n.outputs.size() > 2 && n.outputs[2] != kNoValue && w.dtype != DType::kFloat) {
      int64_t elems = 4;
      for (const Dim& d : w.shape.dims) elems = checked_mul(elems, d.is_known() ? d.value : 0, "weight bytes");
      bytes = checked_add(bytes, elems, "kernel workspace");
    }
    most = std::max(most, bytes);
  }
  return most;
}

}  // namespace

Compiled compile(std::string_view onnx_bytes, const CompileOptions& options) {
  const PipelineOptions po = pipeline_options(options);  // bad options fail before any work
  Compiled c;
  Graph g = import_onnx(onnx_bytes);
  drop_outputs(g, options.dropped_outputs);
  topological_sort(g);
  infer_missing_dtypes(g);  // the exporter leaves some value_info out (Constant outputs)
  verify(g);
  infer_shapes(g);  // before passes and autodiff: both read shapes (rank, provable equality)
  c.passes_changed = run_pipeline(g, default_forward_pipeline(), po);
  if (options.loss_chunk_bytes > 0)
    for (Node& n : g.nodes)
      if (n.op_type == "LinearCrossEntropy" && n.domain == kOurDomain) n.attrs.set("chunk_bytes", options.loss_chunk_bytes);
  c.forward = std::move(g);

  if (!options.training) {
    Placement placement = place_host_values(c.forward);
    c.plan = plan_inference(c.forward);
    c.plan.placement = std::move(placement);
  } else {
    TrainingGraph& tg = c.training.emplace(build_training_graph(c.forward, requires_grad(c.forward, options)));
    infer_shapes(tg.graph);  // the backward values the gradient rules left unknown
    for (std::string& name : run_training_pipeline(tg, default_training_pipeline(), po))
      c.passes_changed.push_back("training:" + name);
    // After the cleanups: CSE would merge the recompute clones back into their forward originals.
    c.recompute = apply_recompute(tg, options.memory_opt_level, options.recompute);
    // Last: placement adds transfer nodes, which no pass or the memory optimizer should see.
    Placement placement = place_host_values(tg.graph, &tg.input_grads);
    tg.num_forward_nodes = static_cast<size_t>(
        std::count_if(tg.graph.nodes.begin(), tg.graph.nodes.end(), [](const Node& n) { return !n.in_backward; }));
    c.plan = plan_training(tg);
    c.plan.placement = std::move(placement);
  }
  c.timeline = memory_timeline(c.executed(), c.plan, c.training ? &*c.training : nullptr);
  c.kernel_workspace_bytes = kernel_workspace(c.executed());
  return c;
}

}  // namespace torch_ort::core
