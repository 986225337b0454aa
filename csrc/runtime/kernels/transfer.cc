// The placement crossings (csrc/core/planner/placement.h): ToHost, a counted device→host read,
// and ToDevice, a host value uploaded once and then served from the step's UploadCache. On the
// CPU both cross nothing, but ToHost still counts: the count says what a device would wait for.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <algorithm>
#include <cstring>

#include <ATen/core/Tensor.h>

#include "csrc/core/planner/placement.h"
#include "csrc/runtime/errors.h"
#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

void to_host_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  HostReadScope::add();
  // A copy on the CPU too: the host value must not share a buffer with a device-side activation
  // (the runtime's memory accounting leaves host values out).
  c.set_output(0, x.is_cpu() ? x.clone() : x.to(at::kCPU));
}

bool same_values(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes().equals(b.sizes()) &&
         std::memcmp(a.const_data_ptr(), b.const_data_ptr(), a.nbytes()) == 0;
}

// The device copy of host tensor `x`: from the cache when these values were uploaded before,
// else a new upload through pinned memory, asynchronous (a pageable copy would make the host
// wait). Entries read while a CUDA graph is captured are kept: the replay reads their buffers.
at::Tensor upload(UploadCache& cache, const at::Tensor& x, c10::Device device) {
  const at::Tensor values = x.contiguous();
  std::lock_guard<std::mutex> lock(cache.mu);
  auto& entries = cache.entries;
  for (size_t k = 0; k < entries.size(); ++k) {
    UploadCache::Entry& e = entries[k];
    if (e.device != device || !same_values(e.host, values)) continue;
    e.kept |= CaptureScope::active();
    std::rotate(entries.begin() + static_cast<std::ptrdiff_t>(k),
                entries.begin() + static_cast<std::ptrdiff_t>(k) + 1, entries.end());
    return entries.back().on_device;
  }
  UploadCache::Entry e;
  e.device = device;
  e.host = values.clone();
  e.on_device = values.pin_memory().to(device, /*non_blocking=*/true);
  e.kept = CaptureScope::active();
  entries.push_back(std::move(e));
  size_t unkept = static_cast<size_t>(std::count_if(entries.begin(), entries.end(),
                                                    [](const UploadCache::Entry& x) { return !x.kept; }));
  for (auto it = entries.begin(); unkept > UploadCache::kMaxUnkept && it != entries.end();) {
    if (it->kept) { ++it; continue; }
    it = entries.erase(it);  // the least recently used first
    --unkept;
  }
  return entries.back().on_device;
}

void to_device_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  if (x.device() == c.device) return c.set_output(0, x);
  if (!x.is_cpu()) c.fail("input is on " + x.device().str() + ", expected the host or " + c.device.str());
  if (!c.upload) c.fail("internal: no upload cache for this step");
  c.set_output(0, upload(*c.upload, x, c.device));
}

// DecisionCheck(X, cond; message) -> X, where cond (read on the host: placement put it there)
// holds; else the decision the export took no longer holds for these values.
void decision_check_kernel(KernelCtx& c) {
  if (!c.input_flag(1, false))
    throw DecisionChangedError(c.node.describe() + ": a decision the export took from the values it saw "
                               "does not hold for these (" + c.attrs.get_string("message", "") + ")");
  c.set_output(0, c.input(0));
}

}  // namespace

REGISTER_KERNEL_IN(kOurDomain, "DecisionCheck", decision_check_kernel);
REGISTER_KERNEL_IN(kOurDomain, kToHost, to_host_kernel);
REGISTER_KERNEL_IN(kOurDomain, kToDevice, to_device_kernel);

}  // namespace torch_ort::kernels
