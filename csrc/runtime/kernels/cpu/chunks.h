// How the CPU optimizer kernels split a call: every tensor into chunks of kChunk elements, the
// chunks over at::parallel_for's threads, and a (param, grad) dtype pair into typed pointers.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "csrc/runtime/errors.h"

namespace torch_ort::optim {

constexpr int64_t kChunk = 1 << 15;  // 128 KiB of fp32: one chunk's p, g, m, v stay in L2

struct Chunk {
  size_t tensor;       // index into the call's lists
  int64_t begin, end;  // element range
};

inline std::vector<Chunk> chunks_of(const std::vector<at::Tensor>& ts) {
  std::vector<Chunk> out;
  for (size_t i = 0; i < ts.size(); ++i)
    for (int64_t b = 0; b < ts[i].numel(); b += kChunk)
      out.push_back({i, b, std::min<int64_t>(b + kChunk, ts[i].numel())});
  return out;
}

// f(chunk, chunk index) on every chunk, in parallel.
template <typename F>
void for_chunks(const std::vector<Chunk>& chunks, const F& f) {
  at::parallel_for(0, int64_t(chunks.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) f(chunks[size_t(c)], c);
  });
}

// f(T*) with t's data as float, c10::Half or c10::BFloat16 (the dtypes check_lists lets through).
template <typename F>
decltype(auto) with_float_type(const at::Tensor& t, const F& f) {
  switch (t.scalar_type()) {
    case at::kHalf: return f(static_cast<c10::Half*>(t.data_ptr()));
    case at::kBFloat16: return f(static_cast<c10::BFloat16*>(t.data_ptr()));
    case at::kFloat: return f(static_cast<float*>(t.data_ptr()));
    default: throw InputMismatchError("dtype " + std::string(c10::toString(t.scalar_type())) +
                                      " in a multi-tensor kernel; expected float32, float16 or bfloat16");
  }
}

// f(P*, G*) for a parameter and its gradient; the gradient is the parameter's dtype or fp32.
template <typename F>
void with_param_grad(const at::Tensor& p, const at::Tensor& g, const F& f) {
  if (g.scalar_type() != p.scalar_type() && g.scalar_type() != at::kFloat)
    throw InputMismatchError("a " + std::string(c10::toString(g.scalar_type())) + " gradient for a " +
                             c10::toString(p.scalar_type()) +
                             " parameter; expected the parameter's dtype or float32");
  with_float_type(p, [&](auto* pp) {
    if (g.scalar_type() == at::kFloat) return f(pp, static_cast<const float*>(g.data_ptr()));
    using P = std::remove_pointer_t<decltype(pp)>;
    return f(pp, static_cast<const P*>(g.data_ptr()));
  });
}

}  // namespace torch_ort::optim
