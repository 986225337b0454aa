// Host values cached per input-shape signature (host_cache.h): which steps qualify, the bounded
// cache, and the executor's bind/record of one step.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "csrc/runtime/host_cache.h"

#include <algorithm>
#include <utility>

#include "csrc/core/ir/aten_op.h"
#include "csrc/core/ir/op_traits.h"
#include "csrc/core/planner/placement.h"
#include "csrc/runtime/executor.h"

namespace torch_ort {

std::vector<int64_t> HostCache::key_of(const std::vector<at::Tensor>& inputs, c10::Device device) {
  std::vector<int64_t> key{static_cast<int64_t>(device.type()), device.index()};
  for (const at::Tensor& t : inputs) {
    key.push_back(t.dim());
    key.insert(key.end(), t.sizes().begin(), t.sizes().end());
  }
  return key;
}

std::shared_ptr<HostCacheEntry> HostCache::find(const std::vector<int64_t>& key) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if ((*it)->key != key) continue;
    entries_.splice(entries_.begin(), entries_, it);
    return entries_.front();
  }
  return nullptr;
}

std::shared_ptr<HostCacheEntry> HostCache::insert(std::vector<int64_t> key, HostValues forward) {
  auto entry = std::make_shared<HostCacheEntry>();
  entry->key = std::move(key);
  entry->forward = std::move(forward);
  std::lock_guard<std::mutex> lock(mu_);
  entries_.remove_if([&](const auto& e) { return e->key == entry->key; });
  entries_.push_front(entry);
  // Runs in flight keep their entry alive through their own reference.
  while (entries_.size() > kMaxEntries) entries_.pop_back();
  return entry;
}

std::shared_ptr<const HostValues> HostCache::backward_of(const HostCacheEntry& entry) {
  std::lock_guard<std::mutex> lock(mu_);
  return entry.backward;
}

void HostCache::set_backward(HostCacheEntry& entry, HostValues backward) {
  auto values = std::make_shared<const HostValues>(std::move(backward));
  std::lock_guard<std::mutex> lock(mu_);
  if (!entry.backward) entry.backward = std::move(values);
}

size_t HostCache::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

std::pair<int, int> mark_cacheable_steps(const Graph& g, std::vector<CompiledStep>& forward,
                                         std::vector<CompiledStep>& backward,
                                         const std::vector<char>& constant,
                                         const std::vector<ValueId>& escaping) {
  // Values the caller receives, and what they may share a buffer with: ToDevice passes a host
  // tensor through on the CPU, a view op or opaque code may return (a view of) a data input.
  std::vector<char> escapes(g.num_values(), 0);
  for (ValueId v : escaping)
    if (v != kNoValue) escapes[v] = 1;
  for (auto* steps : {&backward, &forward})
    for (auto it = steps->rbegin(); it != steps->rend(); ++it) {
      const Node& n = *it->node;
      const bool passes_through = (n.domain == kOurDomain && n.op_type == kToDevice) ||
                                  op_traits(n).view != ViewRule::kNever || is_opaque(n);
      if (!passes_through) continue;
      if (std::none_of(it->outputs.begin(), it->outputs.end(),
                       [&](ValueId v) { return v != kNoValue && escapes[v]; }))
        continue;
      for (size_t i = 0; i < it->inputs.size(); ++i)  // not the inputs read as numbers
        if (it->inputs[i] != kNoValue && !it->host_in[i]) escapes[it->inputs[i]] = 1;
    }

  std::vector<char> derived(constant);  // a pure function of sizes and constants
  derived.resize(g.num_values(), 0);
  std::pair<int, int> counts{0, 0};
  for (auto* steps : {&forward, &backward}) {
    int& count = steps == &forward ? counts.first : counts.second;
    for (CompiledStep& s : *steps) {
      const Node& n = *s.node;
      const bool metadata = op_traits(n).reads_metadata_only;
      bool ok = s.on_host && !is_random(n) && !is_opaque(n);
      if (ok && !metadata)
        for (ValueId v : s.inputs)
          if (v != kNoValue && !derived[v]) ok = false;
      for (ValueId v : s.outputs)
        if (v != kNoValue && escapes[v]) ok = false;
      if (!ok) continue;
      s.cache_index = count++;
      s.cache_guard = metadata;
      for (ValueId v : s.outputs)
        if (v != kNoValue) derived[v] = 1;
    }
  }
  return counts;
}

bool bind_cached(const CompiledStep& s, HostStepRun& run, std::vector<at::Tensor>& slots) {
  const HostValues& values = *run.replay;
  if (s.cache_guard) {
    const at::Tensor& x = slots[s.inputs.at(0)];
    if (!x.defined() || !x.sizes().equals(values.guard[s.cache_index])) {
      run.replay = nullptr;  // its size depends on data: compute the rest of the run as usual
      run.diverged = true;
      return false;
    }
  }
  const std::vector<at::Tensor>& outs = values.outputs[s.cache_index];
  for (size_t i = 0; i < s.outputs.size(); ++i)
    if (s.outputs[i] != kNoValue) slots[s.outputs[i]] = outs[i];
  ++run.skipped;
  return true;
}

void record_cached(const CompiledStep& s, HostStepRun& run, const std::vector<at::Tensor>& slots) {
  HostValues& values = *run.record;
  std::vector<at::Tensor>& outs = values.outputs[s.cache_index];
  outs.assign(s.outputs.size(), at::Tensor());
  // The cache's reference makes the tensors shared, so no kernel writes into them in place
  // (KernelCtx::may_overwrite_input asks for a buffer only its slot holds).
  for (size_t i = 0; i < s.outputs.size(); ++i)
    if (s.outputs[i] != kNoValue) outs[i] = slots[s.outputs[i]];
  if (s.cache_guard) values.guard[s.cache_index] = slots[s.inputs.at(0)].sizes().vec();
}

}  // namespace torch_ort
