// Large CPU buffers kept across steps. glibc maps an allocation above its mmap threshold (128 KiB
// at first, at most 32 MiB) afresh and unmaps it on free, so each step pays the page faults of its
// vocabulary-sized buffers again (a 256 MiB gradient: ~70 ms here, more than writing it; a 32 MB
// chunk of logits made the copy into it five times slower). The kernels that make such buffers
// (the fused LM head's chunk of logits and dW, an embedding's dense gradient) take them from this
// pool when they are 1 MiB or more, and the GEMMs their products when they are kMappedBytes or
// more (returned logits: 2 GiB at a 128k vocabulary):
// a released buffer (a gradient the optimizer dropped with zero_grad, a chunk the step is done
// with) goes back to the pool instead of to the system, and the next request of its size, or up
// to a third smaller, gets it. A buffer idle through one whole forward call is given back to the
// system at the next one (mark()), so the pool holds at most one step's worth of such buffers.
// One pool per process; the engine marks it at each forward; ORTMODULE_CPU_BUFFER_POOL=0 turns it
// off (set_enabled).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

namespace torch_ort {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // Requests below this many bytes are left to malloc, which keeps them in its heap.
  static constexpr int64_t kMinBytes = int64_t{1} << 20;
  // glibc's largest mmap threshold: a request this large is mapped afresh every time, however far
  // the threshold has adapted.
  static constexpr int64_t kMappedBytes = int64_t{32} << 20;

  static BufferPool& process();  // the one every kernel uses
  ~BufferPool();

  // An uninitialized contiguous CPU tensor: from the pool when of min_bytes or more, CPU and
  // enabled; else at::empty. Its storage returns to the pool when the last tensor using it is
  // released.
  at::Tensor empty(c10::IntArrayRef sizes, const at::TensorOptions& options, int64_t min_bytes = kMinBytes);
  // Gives back to the system every buffer that stayed idle since the previous mark.
  void mark();
  void release_idle();  // every idle buffer, now
  void set_enabled(bool on);
  bool enabled() const;
  int64_t idle_bytes() const;
  int64_t reused() const;  // requests served without a fresh allocation, since the process began

 private:
  struct Idle {
    void* ptr;
    int64_t since;  // the mark epoch it went idle in
  };
  void give_back(void* ptr, int64_t nbytes);
  void report(void* ptr, int64_t delta);  // to torch.profiler's memory records

  mutable std::mutex mu_;
  std::multimap<int64_t, Idle> idle_;  // by size in bytes
  int64_t idle_bytes_ = 0;
  int64_t in_use_bytes_ = 0;
  int64_t epoch_ = 0;
  int64_t reused_ = 0;
  bool enabled_ = true;
};

}  // namespace torch_ort
