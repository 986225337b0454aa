// The stages the fuzzer drives (tests/fuzz/fuzz_model_loading.cc), shared with the GoogleTest
// that replays tests/fuzz/regressions and the seed corpus in every build (test_fuzz_regressions.cc).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/ir/onnx_io.h"
#include "csrc/core/ir/type_inference.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"
#include "csrc/core/planner/memory.h"
#include "csrc/core/planner/plan.h"
#include "csrc/core/planner/recompute.h"
#include "csrc/core/shapes/infer_shapes.h"

namespace torch_ort::fuzz {

// The engine's build (Engine::Engine), torch parts left out; every float input requires grad.
inline void compile_like_the_engine(std::string_view bytes) {
  Graph g = import_onnx(bytes);
  topological_sort(g);
  infer_missing_dtypes(g);
  verify(g);
  infer_shapes(g);
  PipelineOptions po;
  po.verify_after_each = true;
  run_pipeline(g, default_forward_pipeline(), po);
  verify(g);

  std::vector<bool> requires_grad;
  for (ValueId v : g.inputs) requires_grad.push_back(is_floating(g.value(v).dtype));
  TrainingGraph tg = build_training_graph(g, requires_grad);
  infer_shapes(tg.graph);
  run_training_pipeline(tg, default_training_pipeline(), po);
  apply_recompute(tg, 1, {});
  const Plan plan = plan_training(tg);
  memory_timeline(tg.graph, plan, &tg);

  // What DebugOptions(save_onnx=True) writes must verify and load back.
  const Graph exportable = as_exportable_graph(tg);
  verify(exportable);
  Graph back = import_onnx(export_onnx(exportable));
  topological_sort(back);
  verify(back);
}

}  // namespace torch_ort::fuzz
