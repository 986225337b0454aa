#include "csrc/core/compile.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "csrc/core/autodiff/gradient_builder.h"
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

}  // namespace

Compiled compile(std::string_view onnx_bytes, const CompileOptions& options) {
  const PipelineOptions po = pipeline_options(options);  // bad options fail before any work
  Compiled c;
  Graph g = import_onnx(onnx_bytes);
  topological_sort(g);
  infer_missing_dtypes(g);  // the exporter leaves some value_info out (Constant outputs)
  verify(g);
  infer_shapes(g);  // before passes and autodiff: both read shapes (rank, provable equality)
  c.passes_changed = run_pipeline(g, default_forward_pipeline(), po);
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
  return c;
}

}  // namespace torch_ort::core
