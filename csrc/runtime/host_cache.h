// Host values computed once per input-shape signature (planner/placement.h puts shape metadata on
// the host; these are the steps that compute it). A step is cacheable when its outputs are a pure
// function of sizes and constants: it computes on the host, draws no random numbers, runs no code
// we do not control, and each input is a constant or the output of a cacheable step — except for
// Shape/Size, which read only their input's sizes. A run keyed by the sizes of every graph input
// records those outputs (a miss) or binds the recorded tensors into the slots and skips the steps
// (a hit). Each Shape/Size step keeps its input's sizes as a guard: a tensor whose size depends on
// data (Range over a number read from an input) fails it, and the run computes the rest as usual.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "csrc/core/ir/graph.h"

namespace torch_ort {

struct CompiledStep;

// The recorded outputs of one phase's cacheable steps, by CompiledStep::cache_index.
struct HostValues {
  explicit HostValues(size_t steps = 0) : outputs(steps), guard(steps) {}
  std::vector<std::vector<at::Tensor>> outputs;  // per step: its outputs (undefined: unread)
  std::vector<std::vector<int64_t>> guard;       // per Shape/Size step: its input's sizes
};

// One input-shape signature: the forward's values, and the backward's once one backward finished.
struct HostCacheEntry {
  std::vector<int64_t> key;
  HostValues forward;
  std::shared_ptr<const HostValues> backward;  // set once, under HostCache's lock
};

// What one run (a forward, or a whole backward across its pieces) does with cacheable steps.
struct HostStepRun {
  const HostValues* replay = nullptr;  // a hit: bind these values instead of running the steps
  std::unique_ptr<HostValues> record;  // a miss: filled as the steps run
  bool diverged = false;               // a guard failed: the rest ran as usual, nothing recorded
  int64_t ran = 0;                     // host steps that ran
  int64_t skipped = 0;                 // host steps whose outputs came from the cache
};

// A few signatures, least recently used evicted first: a new sequence length per step costs one
// miss, never unbounded memory. Entries are immutable once published (the backward part is set
// once), so a run reads its entry without holding the lock. Safe to share between threads.
class HostCache {
 public:
  static constexpr size_t kMaxEntries = 8;

  // The sizes of every input (rank first) and the run's device: what a cacheable value depends on
  // besides the constants (dtypes and ranks are fixed per engine).
  static std::vector<int64_t> key_of(const std::vector<at::Tensor>& inputs, c10::Device device);

  std::shared_ptr<HostCacheEntry> find(const std::vector<int64_t>& key);
  // Publishes a forward recorded for `key` (replacing an entry a concurrent miss published).
  std::shared_ptr<HostCacheEntry> insert(std::vector<int64_t> key, HostValues forward);
  // The backward values of `entry`, or nullptr; and setting them once.
  std::shared_ptr<const HostValues> backward_of(const HostCacheEntry& entry);
  void set_backward(HostCacheEntry& entry, HostValues backward);
  size_t size();

 private:
  std::mutex mu_;
  std::list<std::shared_ptr<HostCacheEntry>> entries_;  // most recently used first
};

// Marks the cacheable steps of both phases (forward first: backward reads what forward left) and
// numbers them per phase (CompiledStep::cache_index); returns the count per phase. `constant`
// marks the engine's constants. A host value that reaches the caller (a graph output, or an input
// gradient, through ToDevice, which on the CPU hands over the host tensor itself) is never cached,
// nor anything on the host it derives from: the caller may write into it.
std::pair<int, int> mark_cacheable_steps(const Graph& g, std::vector<CompiledStep>& forward,
                                         std::vector<CompiledStep>& backward,
                                         const std::vector<char>& constant,
                                         const std::vector<ValueId>& escaping);

// The executor's side, one cacheable step at a time. Before the kernel: on a replay, bind the
// recorded outputs if the guard holds and return true (skip the step); else the run stops
// replaying. After the kernel: on a record, keep the outputs (and the guard).
bool bind_cached(const CompiledStep& s, HostStepRun& run, std::vector<at::Tensor>& slots);
void record_cached(const CompiledStep& s, HostStepRun& run, const std::vector<at::Tensor>& slots);

}  // namespace torch_ort
