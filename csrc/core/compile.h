// The compiler's front door: ONNX bytes and options in; the optimized forward graph, the training
// graph, the plan and its memory timeline out. It runs every torch-free stage in order
// (import -> verify -> shapes -> passes -> autodiff -> passes -> recompute -> placement -> plan)
// and nothing else; the runtime's Engine binds kernels to the result and runs it, and the C++
// tests and the fuzzer call the same function, so all three compile a graph the same way.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "csrc/core/ir/graph.h"
#include "csrc/core/ir/training_graph.h"
#include "csrc/core/planner/memory.h"
#include "csrc/core/planner/plan.h"
#include "csrc/core/planner/recompute.h"

namespace torch_ort::core {

struct CompileOptions {
  bool training = false;                     // build forward+backward, or forward only
  std::vector<bool> input_requires_grad;     // training: per graph input, is its gradient wanted?
  std::vector<std::string> disabled_passes;  // pass names to skip (pass_names(); not the lowerings)
  int memory_opt_level = 0;                  // ORTMODULE_MEMORY_OPT_LEVEL (training only)
  std::vector<RecomputeRequest> recompute;   // ORTMODULE_MEMORY_OPT_CONFIG
  bool every_float_input_requires_grad = false;  // training: instead of input_requires_grad
  bool verify_after_each_pass = false;       // tests and the fuzzer: verify() after every pass
  // Graph outputs (indices into the imported graph's outputs) nobody will read: removed before
  // any pass, so the work only they needed goes (ORTMODULE_SKIP_LOGITS: the logits beside a loss).
  std::vector<int64_t> dropped_outputs;
  // Logits bytes per chunk of every LinearCrossEntropy (the LM head with its loss); 0: the pass's
  // default. ORTMODULE_MEMORY_BUDGET's planner picks it.
  int64_t loss_chunk_bytes = 0;
};

struct Compiled {
  Graph forward;                         // after the forward pipeline
  std::optional<TrainingGraph> training; // training only: forward + backward, after its pipeline
  RecomputeResult recompute;             // training only: what the memory optimizer did
  Plan plan;                             // of the executed graph, placement included
  MemoryTimeline timeline;               // the static memory estimate of plan
  std::vector<std::string> passes_changed;  // passes that changed a graph ("training:" after autodiff)
  // Bytes kernels allocate for themselves beyond the plan's values, at most, at one step (the
  // chunks of LinearCrossEntropy); the memory timeline does not hold them.
  int64_t kernel_workspace_bytes = 0;

  // The graph the plan's steps index: the training graph when there is one, else the forward.
  const Graph& executed() const { return training ? training->graph : forward; }
};

// Throws OnnxImportError, VerifyError, GradientError or UnsupportedOpError (ir/errors.h) for a
// graph it cannot compile, std::invalid_argument for options that do not fit it (an unknown or
// required pass name, an input_requires_grad of the wrong length).
Compiled compile(std::string_view onnx_bytes, const CompileOptions& options);

}  // namespace torch_ort::core
