// The engine: one exported graph + one mode, compiled once (import, passes, autodiff, plan,
// kernels) and then run many times. forward() returns a RunContext holding only the saved set;
// backward() consumes it. Several RunContexts may be alive at once (gradient accumulation, a
// module called twice per step); each may be consumed once.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "csrc/core/compile.h"
#include "csrc/core/planner/memory.h"
#include "csrc/core/planner/plan.h"
#include "csrc/core/planner/recompute.h"
#include "csrc/runtime/executor.h"

namespace torch_ort {

// What the engine compiles: the front door's options (core/compile.h).
using EngineOptions = core::CompileOptions;

// Activation bytes one step held, measured while it ran (Engine::set_memory_tracking), with the
// accounting of the static estimate (planner/memory.h). -1: not measured.
struct MeasuredMemory {
  int64_t forward_peak = -1;
  int64_t saved = -1;          // kept from forward for backward
  int64_t outputs = -1;        // graph outputs not also saved (the caller holds them)
  int64_t backward_peak = -1;
  int64_t peak = -1;           // max(forward_peak, outputs + backward_peak)
};

// How many objects of T are alive, process-wide: run contexts and backward runs hold activations,
// so tests (and torch_ort._C.live_runs) check that they die with the outputs that own them.
template <typename T>
struct LiveCount {
  static inline std::atomic<int64_t> alive{0};
  LiveCount() { ++alive; }
  LiveCount(const LiveCount&) { ++alive; }
  LiveCount& operator=(const LiveCount&) = default;
  ~LiveCount() { --alive; }
};

// What one forward call leaves for its backward.
struct RunContext {
  uint64_t engine_id = 0;                                // the engine that made it
  c10::Device device = c10::Device(c10::kCPU);           // where forward ran
  std::vector<std::pair<ValueId, at::Tensor>> saved;     // plan.saved, nothing else
  std::vector<std::vector<int64_t>> output_sizes;        // to build zero gradients for None
  std::vector<at::TensorOptions> output_options;
  MeasuredMemory measured;                               // forward's part, when tracked
  LiveBytes::Excluded untracked;                         // when tracked: buffers not counted
  std::atomic<bool> consumed{false};
  int64_t host_reads = 0;                                // device→host reads forward made
  std::shared_ptr<HostCacheEntry> host_entry;            // forward's signature (null: uncached)
  LiveCount<RunContext> counted;
};

// A backward in progress (Engine::backward_begin), run in pieces by backward_take so that each
// input's gradient can be handed to PyTorch as soon as it is final: DDP all-reduces those
// parameters while the rest of backward still runs.
struct BackwardRun {
  uint64_t engine_id = 0;              // the engine that began it
  std::vector<at::Tensor> slots;       // one per value of the training graph
  std::optional<LiveBytes> live;       // when forward was measured
  MeasuredMemory measured;             // forward's part
  c10::Device device = c10::Device(c10::kCPU);
  size_t next = 0;                     // the next backward step to run
  std::vector<char> taken;             // per graph input: its gradient was handed over
  bool finished = false;               // every step ran (and the measurement was recorded)
  int64_t host_reads = 0;              // device→host reads its steps made so far
  std::shared_ptr<HostCacheEntry> host_entry;     // forward's signature (null: uncached)
  std::shared_ptr<const HostValues> host_values;  // its backward values, when replaying them
  HostStepRun host;                    // the cacheable host steps: replayed, recorded, counted
  LiveCount<BackwardRun> counted;
};

struct EngineStats {
  int64_t num_forward_nodes = 0;
  int64_t num_backward_nodes = 0;
  int64_t num_forward_values = 0;     // values forward nodes produce ("save everything" count)
  int64_t num_saved_activations = 0;  // saved values produced by forward nodes
  int64_t num_saved = 0;              // the saved set, graph inputs included
  int64_t num_constants = 0;          // initializers + hoisted Constant nodes
  std::vector<std::string> saved_names;
  std::vector<std::string> passes_changed;  // passes that changed a graph ("training:" after autodiff)
  int64_t kernel_workspace_bytes = 0;       // beyond the plan (core::Compiled)
  int64_t recompute_nodes = 0;              // forward nodes cloned into backward (memory optimizer)
  // Placement (planner/placement.h): nodes computing on the host, and the crossings, per phase.
  int64_t host_nodes = 0;
  int64_t to_host_forward = 0, to_host_backward = 0;      // ToHost nodes: reads every run makes
  int64_t to_device_forward = 0, to_device_backward = 0;  // ToDevice nodes (cached uploads)
  // Host steps computed once per input-shape signature (host_cache.h), per phase.
  int64_t host_cacheable_forward = 0, host_cacheable_backward = 0;
  // The executed graph's nodes per op, "op_type" (ONNX) or "domain::op_type" (constants folded away).
  std::map<std::string, int64_t> op_counts;
};

// The memory report of an engine for one call's input sizes: the static estimate and the
// recompute opportunities (training engines), before anything runs.
struct MemoryReport {
  PeakEstimate predicted;
  RecomputeResult recompute;                  // opportunities with their on/off marks
  std::vector<int64_t> bytes_saved_each;      // per opportunity, evaluated (-1: unbound)
  std::vector<std::string> bytes_saved_formula;  // per opportunity, symbols renamed
  std::vector<std::string> unknown_values;    // values whose size has no formula
};

// One row of Engine::check_shapes: a value's inferred shape against the tensor a run produced.
struct ValueShapeCheck {
  std::string name;              // the value
  std::string inferred;          // as inference left it: "[s0,32]", "[?]" when the rank is unknown
  std::vector<int64_t> actual;   // sizes of the tensor the run produced
  int64_t unchecked_dims = 0;    // dims with nothing to compare (unknown, or an unbound symbol)
  bool rank_known = false;       // false: nothing was compared
};

class Engine {
 public:
  // Throws OnnxImportError / VerifyError / GradientError / UnsupportedOpError (see errors.h).
  Engine(const std::string& onnx_bytes, EngineOptions options);
  Engine(const Engine&) = delete;  // steps point into the owned graph
  Engine& operator=(const Engine&) = delete;

  // Validates the inputs (count, dtype, rank, known sizes) -> InputMismatchError naming the
  // input. Returns the graph outputs and, in training mode, the context for backward.
  std::pair<std::vector<at::Tensor>, std::shared_ptr<RunContext>> forward(
      const std::vector<at::Tensor>& inputs) const;
  // One gradient per graph output (nullopt: none flows -> zeros where one is needed). Returns
  // one gradient per graph input, nullopt where input_grad_available() is false.
  std::vector<std::optional<at::Tensor>> backward(
      RunContext& ctx, const std::vector<std::optional<at::Tensor>>& grad_outputs) const;
  // backward() in pieces (engine_backward.cc): begin consumes the context and binds the output
  // gradients; take runs the backward steps up to `steps` (at least the input_grad_ready() of
  // every input asked for; -1: all) and hands over those inputs' gradients, releasing the
  // engine's references so PyTorch may adopt the tensors as param.grad without a copy.
  std::unique_ptr<BackwardRun> backward_begin(
      RunContext& ctx, const std::vector<std::optional<at::Tensor>>& grad_outputs) const;
  std::vector<std::optional<at::Tensor>> backward_take(BackwardRun& run, int64_t steps,
                                                       const std::vector<int64_t>& inputs) const;
  // Per graph input: how many backward steps must run before its gradient is final and nothing
  // later reads the gradient or the input itself (so a hook may update the parameter in place,
  // as an optimizer-in-backward does); -1: no gradient. And the number of backward steps.
  const std::vector<int64_t>& input_grad_ready() const { return input_grad_ready_; }
  int64_t num_backward_steps() const { return static_cast<int64_t>(backward_steps_.size()); }
  // Whether a backward step runs code we do not control (PythonOp, ATenOp, ATenOpGrad: a user
  // Function, PyTorch autograd, the ATen dispatcher), which may raise anything; our own kernels
  // fail only on resources (out of memory, a device fault). Only for such engines does the
  // bridge copy an accumulated .grad it hands over early, to undo it (bridge.py, _Handover).
  bool backward_runs_opaque_code() const { return backward_opaque_; }
  // The same for either half: such code may wait on the device or keep state between calls, so
  // a CUDA graph never captures it (ortmodule/cuda_graph.py).
  bool runs_opaque_code() const { return opaque_; }

  bool training() const { return options_.training; }
  std::vector<std::string> input_names() const;
  std::vector<std::string> output_names() const;
  std::vector<bool> output_differentiable() const;  // floating and a gradient input exists
  std::vector<bool> input_grad_available() const;
  std::string forward_graph_onnx() const;   // the optimized forward graph
  std::string training_graph_onnx() const;  // forward+backward (training engines only)
  EngineStats stats() const { return stats_; }
  // Device→host reads of the last forward call and of the last finished backward (-1: none yet),
  // counted on every device (HostReadScope). A well-placed model reads nothing.
  int64_t last_host_reads_forward() const { return last_host_reads_forward_; }
  int64_t last_host_reads_backward() const { return last_host_reads_backward_; }
  // The share of labels that counted in the last forward's label sparsity (LabelRows); -1 when
  // it had none.
  double last_label_density() const { return last_label_density_; }
  // The share of (batch, sequence) rows padding elimination kept in the last forward
  // (PaddingRows); -1 when it had none.
  double last_row_density() const { return last_row_density_; }
  // Host steps the last forward and the last finished backward ran, and those whose outputs came
  // from the host-value cache instead (host_cache.h); -1: none yet. A steady step runs none.
  int64_t last_host_steps_forward() const { return last_host_steps_forward_; }
  int64_t last_host_steps_backward() const { return last_host_steps_backward_; }
  int64_t last_host_steps_cached_forward() const { return last_host_steps_cached_forward_; }
  int64_t last_host_steps_cached_backward() const { return last_host_steps_cached_backward_; }
  size_t host_cache_size() const { return host_cache_.size(); }  // signatures held
  // Where each value of the executed graph lives.
  const Placement& placement() const { return plan_.placement; }

  // The static memory estimate and the recompute table for inputs of these sizes (one entry per
  // graph input). Throws InputMismatchError when the count differs.
  MemoryReport memory_report(const std::vector<std::vector<int64_t>>& input_sizes) const;
  // While on, every run measures the activation bytes it holds; the last complete step's figures
  // are returned by measured_memory (forward-only runs fill forward_peak only).
  void set_memory_tracking(bool on) const { track_memory_ = on; }
  MeasuredMemory measured_memory() const;
  const Graph& memory_graph() const { return exec_graph(); }  // names the report's values

  // Debug (engine_shapes.cc): runs forward (and backward with all-ones output gradients) keeping
  // every tensor, then compares each with its inferred shape, binding each symbol to the first
  // size it meets (inputs first). A mismatch throws VerifyError naming the value and its node.
  std::vector<ValueShapeCheck> check_shapes(const std::vector<at::Tensor>& inputs) const;
  // (name, inferred shape) of every value of the executed graph, in id order.
  std::vector<std::pair<std::string, std::string>> value_shapes() const;

 private:
  const Graph& exec_graph() const { return tg_ ? tg_->graph : forward_; }
  // Constants on `device` (moved there once per device, then cached).
  const std::vector<std::pair<ValueId, at::Tensor>>& constants_on(c10::Device device) const;
  void check_inputs(const std::vector<at::Tensor>& inputs) const;
  void record_measured(const MeasuredMemory& m) const;
  void compute_input_grad_ready();  // engine_backward.cc, once the backward steps are final

  EngineOptions options_;
  uint64_t id_;
  Graph forward_;                    // after the pass pipeline
  std::optional<TrainingGraph> tg_;  // training engines only
  Plan plan_;
  RecomputeResult recompute_;        // training engines: what the memory optimizer did
  MemoryTimeline timeline_;          // static memory estimate of plan_
  std::vector<CompiledStep> forward_steps_, backward_steps_;
  std::vector<int64_t> input_grad_ready_;  // see input_grad_ready()
  bool backward_opaque_ = false;            // see backward_runs_opaque_code()
  bool opaque_ = false;                     // see runs_opaque_code()
  std::vector<at::ScalarType> input_types_;  // per graph input
  EngineStats stats_;

  mutable std::atomic<int64_t> last_host_reads_forward_{-1};
  mutable std::atomic<int64_t> last_host_reads_backward_{-1};
  mutable std::atomic<double> last_label_density_{-1.0};
  mutable std::atomic<double> last_row_density_{-1.0};
  mutable std::atomic<int64_t> last_host_steps_forward_{-1}, last_host_steps_backward_{-1};
  mutable std::atomic<int64_t> last_host_steps_cached_forward_{-1};
  mutable std::atomic<int64_t> last_host_steps_cached_backward_{-1};
  mutable HostCache host_cache_;  // host values per input-shape signature
  mutable std::atomic<bool> track_memory_{false};
  mutable std::mutex measured_mu_;
  mutable MeasuredMemory measured_;

  mutable std::mutex constants_mu_;
  mutable std::map<std::string, std::vector<std::pair<ValueId, at::Tensor>>> constants_;  // by device
};

}  // namespace torch_ort
