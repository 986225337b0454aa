// Which CPU path the optimizer kernels take (simd.h): AVX-512 when the processor has it, unless
// set_cpu_path("portable") asked otherwise.
#include <atomic>
#include <stdexcept>

#include "csrc/runtime/kernels/cpu/simd.h"
#include "csrc/runtime/kernels/multi_tensor.h"

namespace torch_ort::optim {
namespace {

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return yes;
}

std::atomic<bool> force_portable{false};

}  // namespace

bool simd::use_avx512() { return has_avx512() && !force_portable.load(std::memory_order_relaxed); }

std::string cpu_path() { return simd::use_avx512() ? "avx512" : "portable"; }

void set_cpu_path(const std::string& path) {
  if (path == "portable") {
    force_portable = true;
  } else if (path == "auto" || (path == "avx512" && has_avx512())) {
    force_portable = false;
  } else if (path == "avx512") {
    throw std::invalid_argument("this processor has no AVX-512 (avx512f/bw/vl/dq)");
  } else {
    throw std::invalid_argument("cpu path must be 'auto', 'avx512' or 'portable', got '" + path + "'");
  }
}

}  // namespace torch_ort::optim
