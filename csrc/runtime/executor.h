// The executor: a plan's steps compiled once into kernel calls over tensor slots (one slot per
// ValueId), then run as a flat loop that frees every buffer right after its last use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include "csrc/core/planner/placement.h"
#include "csrc/core/planner/plan.h"
#include "csrc/runtime/host_cache.h"
#include "csrc/runtime/kernel.h"

namespace torch_ort {

// One step, resolved at engine build time: nothing is looked up while running.
struct CompiledStep {
  KernelFn fn;                      // from the kernel registry
  const Node* node;                 // into the engine's graph (attrs, error messages)
  int64_t opset;                    // of the node's domain
  std::vector<ValueId> inputs;      // kNoValue: omitted optional input
  std::vector<ValueId> outputs;     // kNoValue: omitted, or produced but never read
  std::vector<ValueId> free_after;  // slots dropped right after this step
  std::vector<bool> none_ok;        // per output: may stay unset (a None gradient no node reads)
  int inplace = -1;                 // Step::inplace: input whose buffer output 0 may take over
  bool caller_autocast = false;     // runs under the caller's autocast state (PythonOp, ATenOpGrad)
  bool on_host = false;             // computes on the CPU whatever the run's device (placement.h)
  std::vector<char> host_in;        // per input: a declared host input (read as numbers)
  std::vector<char> untracked;      // per output: a host value or an upload: not activation memory
  std::shared_ptr<UploadCache> upload;  // ToDevice steps: the device copies across runs
  int cache_index = -1;             // a cacheable host step: its index in HostValues (host_cache.h)
  bool cache_guard = false;         // ... that reads only its input's sizes, kept as the guard
  std::string profile_name;         // its range in torch.profiler: "torch_ort::<op_type>"
};

// Per value: does any node, graph output or extra root read it? (Unread outputs are skipped.)
std::vector<char> values_read(const Graph& g, const std::vector<ValueId>& extra_roots);

// Resolves the kernel of every step. Throws UnsupportedOpError naming each op without a kernel
// and its node, so an unsupported model fails when the engine is built, not at the first run.
std::vector<CompiledStep> compile_steps(const Graph& g, const std::vector<Step>& steps,
                                        const std::vector<char>& read, const Placement& placement);

// Measures the activation bytes a run holds, with the planner's accounting (planner/memory.h):
// unique buffers over the slots after each step's kernel, before its frees. Buffers marked
// excluded (graph inputs, constants, incoming gradients, host values — and views of them) are never
// counted. An excluded buffer is held until the count ends, so its address is never reused by a
// buffer that should count (host values are freed and reallocated within one run).
class LiveBytes {
 public:
  void exclude(const at::Tensor& t);
  using Excluded = std::unordered_map<const void*, c10::Storage>;
  void exclude(const Excluded& buffers) { excluded_.insert(buffers.begin(), buffers.end()); }
  const Excluded& excluded() const { return excluded_; }
  void add(const at::Tensor& t);     // a slot now holds t
  void remove(const at::Tensor& t);  // a slot dropped t
  void sample() { peak_ = std::max(peak_, current_); }
  int64_t current() const { return current_; }
  int64_t peak() const { return peak_; }
  // Bytes of the distinct, not excluded buffers among `tensors` (not added to the count).
  int64_t unique_bytes(const std::vector<at::Tensor>& tensors) const;

 private:
  std::unordered_map<const void*, std::pair<int64_t, int64_t>> held_;  // buffer -> (slots, bytes)
  Excluded excluded_;
  int64_t current_ = 0, peak_ = 0;
};

// Runs the steps over `slots`. Kernel failures become KernelError naming the op and the node.
// The graph already holds autocast's casts, so kernels run with autocast off; steps marked
// caller_autocast run user code or PyTorch autograd and see the caller's state, as in eager.
// `live` (optional) is told of every slot set and dropped, and sampled after each kernel.
// `host` (optional) replays or records the cacheable host steps and counts the host steps run.
void run_steps(const std::vector<CompiledStep>& steps, std::vector<at::Tensor>& slots,
               c10::Device device, LiveBytes* live = nullptr, HostStepRun* host = nullptr);
// Steps [begin, end) only (a backward run in pieces).
void run_steps(const std::vector<CompiledStep>& steps, size_t begin, size_t end,
               std::vector<at::Tensor>& slots, c10::Device device, LiveBytes* live = nullptr,
               HostStepRun* host = nullptr);

}  // namespace torch_ort
