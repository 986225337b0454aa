// Which CPU path the optimizer kernels take (simd.h): the widest the processor has (AVX-512, else
// AVX2 for the loops that have it), unless set_cpu_path asked for a narrower one.
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

bool has_avx2() {
  static const bool yes =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return yes;
}

enum Level { kPortable, kAvx2, kAvx512 };
std::atomic<int> widest{kAvx512};  // set_cpu_path's cap

}  // namespace

bool simd::use_avx512() { return has_avx512() && widest.load(std::memory_order_relaxed) >= kAvx512; }
bool simd::use_avx2() { return has_avx2() && widest.load(std::memory_order_relaxed) >= kAvx2; }

std::string cpu_path() {
  if (simd::use_avx512()) return "avx512";
  return simd::use_avx2() ? "avx2" : "portable";
}

void set_cpu_path(const std::string& path) {
  if (path == "auto" || (path == "avx512" && has_avx512())) {
    widest = kAvx512;
  } else if (path == "avx2" && has_avx2()) {
    widest = kAvx2;
  } else if (path == "portable") {
    widest = kPortable;
  } else if (path == "avx512") {
    throw std::invalid_argument("this processor has no AVX-512 (avx512f/bw/vl/dq)");
  } else if (path == "avx2") {
    throw std::invalid_argument("this processor has no AVX2 (avx2/fma/f16c)");
  } else {
    throw std::invalid_argument("cpu path must be 'auto', 'avx512', 'avx2' or 'portable', got '" + path + "'");
  }
}

}  // namespace torch_ort::optim
