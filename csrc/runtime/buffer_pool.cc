#include "csrc/runtime/buffer_pool.h"

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>

namespace torch_ort {

BufferPool& BufferPool::process() {
  // Shared: a buffer's deleter holds the pool, so one released after the process's statics are
  // gone (a gradient kept to the end) still finds it.
  static const std::shared_ptr<BufferPool> pool = std::make_shared<BufferPool>();
  return *pool;
}

BufferPool::~BufferPool() { release_idle(); }

at::Tensor BufferPool::empty(c10::IntArrayRef sizes, const at::TensorOptions& options, int64_t min_bytes) {
  const bool cpu = !options.has_device() || options.device().is_cpu();
  int64_t nbytes = static_cast<int64_t>(options.dtype().itemsize());
  for (int64_t s : sizes) nbytes *= s;
  if (!cpu || nbytes < std::max(min_bytes, kMinBytes) || !enabled()) return at::empty(sizes, options);
  void* ptr = nullptr;
  int64_t capacity = nbytes;
  {
    // The smallest idle buffer that holds the request, if it is not much larger: the LM head's
    // chunk changes size with the counted rows of each batch, and the largest one recently seen
    // then serves them all.
    std::lock_guard<std::mutex> lock(mu_);
    auto it = idle_.lower_bound(nbytes);
    if (it != idle_.end() && it->first <= nbytes + nbytes / 2) {
      ptr = it->second.ptr;
      capacity = it->first;
      idle_bytes_ -= capacity;
      ++reused_;
      idle_.erase(it);
    }
  }
  if (!ptr) ptr = c10::alloc_cpu(static_cast<size_t>(nbytes));
  report(ptr, capacity);
  std::shared_ptr<BufferPool> self = shared_from_this();
  return at::from_blob(ptr, sizes, [self, capacity](void* p) { self->give_back(p, capacity); },
                       options.device(c10::kCPU));
}

// Each take and give-back reaches torch.profiler's memory records as an allocation and a free
// would (as the CUDA caching allocator reports its blocks): a step's measured memory is the same
// whether its buffers came from the pool or not.
void BufferPool::report(void* ptr, int64_t delta) {
  int64_t in_use = 0, held = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_bytes_ += delta;
    in_use = in_use_bytes_;
    held = in_use_bytes_ + idle_bytes_;
  }
  if (c10::memoryProfilingEnabled())
    c10::reportMemoryUsageToProfiler(ptr, delta, static_cast<size_t>(in_use), static_cast<size_t>(held),
                                     c10::Device(c10::kCPU));
}

void BufferPool::give_back(void* ptr, int64_t nbytes) {
  report(ptr, -nbytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (enabled_) {
      idle_.emplace(nbytes, Idle{ptr, epoch_});
      idle_bytes_ += nbytes;
      return;
    }
  }
  c10::free_cpu(ptr);
}

void BufferPool::mark() {
  std::vector<void*> stale;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = idle_.begin(); it != idle_.end();) {
      if (it->second.since < epoch_) {
        stale.push_back(it->second.ptr);
        idle_bytes_ -= it->first;
        it = idle_.erase(it);
      } else {
        ++it;
      }
    }
    ++epoch_;
  }
  for (void* p : stale) c10::free_cpu(p);
}

void BufferPool::release_idle() {
  std::multimap<int64_t, Idle> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all.swap(idle_);
    idle_bytes_ = 0;
  }
  for (auto& [n, idle] : all) c10::free_cpu(idle.ptr);
}

void BufferPool::set_enabled(bool on) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    enabled_ = on;
  }
  if (!on) release_idle();
}

bool BufferPool::enabled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return enabled_;
}

int64_t BufferPool::idle_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return idle_bytes_;
}

int64_t BufferPool::reused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reused_;
}

}  // namespace torch_ort
