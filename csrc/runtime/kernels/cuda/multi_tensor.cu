// CUDA multi-tensor optimizer kernels: up to kMaxTensors tensors and kMaxBlocks chunks of kChunk
// elements per launch, their addresses passed by value in the launch's arguments (no host-to-device
// copy); each block does one chunk. The element math is the CPU kernels' (kernels/cpu/*.cc), in the
// same order. No torch headers here: launch.h is the whole interface.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "csrc/runtime/kernels/cuda/element_io.cuh"

#include "csrc/runtime/kernels/cuda/launch.h"

namespace torch_ort::optim::cuda {
namespace {

using ::torch_ort::cuda::load;
using ::torch_ort::cuda::store;

constexpr int kChunk = 65536;
constexpr int kThreads = 512;
constexpr int kMaxBlocks = 320;

// Tensors per launch by list count: the launch's arguments stay under 4 KiB.
template <int kDepth> struct Capacity;
template <> struct Capacity<1> { static constexpr int value = 110; };
template <> struct Capacity<2> { static constexpr int value = 64; };
template <> struct Capacity<4> { static constexpr int value = 36; };

template <int kDepth>
struct Meta {
  static constexpr int kMaxTensors = Capacity<kDepth>::value;
  void* ptr[kDepth][kMaxTensors];
  int64_t numel[kMaxTensors];
  int index[kMaxTensors];                 // the tensor's index in the whole call (LAMB's sums)
  unsigned char block_tensor[kMaxBlocks];
  int block_chunk[kMaxBlocks];
};


// The elements of this block's chunk: [begin, end) of tensor t.
template <int kDepth>
__device__ __forceinline__ void chunk_of(const Meta<kDepth>& m, int& t, int64_t& begin, int64_t& end) {
  t = m.block_tensor[blockIdx.x];
  begin = int64_t(m.block_chunk[blockIdx.x]) * kChunk;
  end = min(begin + kChunk, m.numel[t]);
}

// Plain multiplies and adds (__fmul_rn/__fadd_rn) keep nvcc from contracting into FMAs, as the
// CPU kernels do, so the devices agree to the bit wherever sqrt and division do.
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }

// The step's device scalars: whether to leave everything as it is, and the gradient factor (the
// host's float(grad_scale) when there is no device factor, as the CPU kernel rounds it).
__device__ __forceinline__ bool skipped(const DeviceScalars& d) { return d.skip != nullptr && *d.skip != 0.0f; }
__device__ __forceinline__ float grad_factor(const DeviceScalars& d, float host) {
  return d.scale_by != nullptr ? float(d.grad_scale * *d.scale_by) : host;
}
// 1 - β^t for the device's step (adam_terms/lamb_terms in multi_tensor.cc, in double).
__device__ __forceinline__ double bias_correction(const DeviceScalars& d, double beta) {
  return d.bias_correction ? 1.0 - pow(beta, *d.step) : 1.0;
}
// Adam's step_size and inv_sqrt_bc2 for the device's step (adam_terms).
template <int kMode>
__device__ __forceinline__ void adam_step_terms(const AdamArgs& a, float& step_size, float& inv_sqrt_bc2) {
  step_size = a.step_size;
  inv_sqrt_bc2 = a.inv_sqrt_bc2;
  if (a.dev.step == nullptr) return;
  const double bc1 = bias_correction(a.dev, a.dev.beta1), bc2 = bias_correction(a.dev, a.dev.beta2);
  if (kMode == 2) {
    step_size = float(a.dev.lr / bc1);
    inv_sqrt_bc2 = float(1.0 / sqrt(bc2));
  } else {
    step_size = float(a.dev.lr * sqrt(bc2) / bc1);
  }
}
// LAMB's arguments with inv_bc1 and inv_bc2 for the device's step (lamb_terms).
__device__ __forceinline__ LambArgs lamb_for_step(const LambArgs& a) {
  LambArgs b = a;
  if (a.dev.step != nullptr) {
    b.inv_bc1 = float(1.0 / bias_correction(a.dev, a.dev.beta1));
    b.inv_bc2 = float(1.0 / bias_correction(a.dev, a.dev.beta2));
  }
  return b;
}

template <typename P, typename G, int kMode>
__global__ void adam_kernel(Meta<4> m, AdamArgs a) {
  if (skipped(a.dev)) return;
  const float grad_scale = grad_factor(a.dev, a.grad_scale);
  float step_size, inv_sqrt_bc2;
  adam_step_terms<kMode>(a, step_size, inv_sqrt_bc2);
  int t;
  int64_t begin, end;
  chunk_of(m, t, begin, end);
  P* p = static_cast<P*>(m.ptr[0][t]);
  const G* g = static_cast<const G*>(m.ptr[1][t]);
  float* ma = static_cast<float*>(m.ptr[2][t]);
  float* va = static_cast<float*>(m.ptr[3][t]);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float pi = load(p, i), gi = mul(load(g, i), grad_scale);
    if (kMode == 2) pi = mul(pi, a.decay);
    if (kMode == 0) gi = add(gi, mul(a.l2, pi));
    const float mi = add(mul(a.b1, ma[i]), mul(a.one_minus_b1, gi));
    const float vi = add(mul(a.b2, va[i]), mul(a.one_minus_b2, mul(gi, gi)));
    float root = sqrtf(vi);
    if (kMode == 2) root = mul(root, inv_sqrt_bc2);
    pi = pi - __fdiv_rn(mul(step_size, mi), add(root, a.eps));
    if (kMode == 1) pi = mul(pi, a.decay);
    ma[i] = mi;
    va[i] = vi;
    store(p, i, pi);
  }
}

__device__ __forceinline__ float lamb_update(float p, float m, float v, const LambArgs& a) {
  float u = __fdiv_rn(mul(m, a.inv_bc1), add(sqrtf(mul(v, a.inv_bc2)), a.eps));
  if (a.adam_w) u = add(u, mul(a.wd, p));
  return u;
}

static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block_sum needs whole warps");
static_assert(sizeof(Meta<4>) + sizeof(LambArgs) + 2 * sizeof(void*) + sizeof(int64_t) <= 4096 &&
                  sizeof(Meta<2>) + sizeof(double) + 2 * sizeof(void*) <= 4096 &&
                  sizeof(Meta<1>) + 2 * sizeof(void*) + sizeof(int64_t) <= 4096,
              "a launch's arguments must fit in 4 KiB");

// Block-wide sum of one double per thread, in a fixed order (the same result every run); the
// total is valid in thread 0. Every thread of the block must call it.
__device__ double block_sum(double x) {
  __shared__ double part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = x;
  __syncthreads();
  double total = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kThreads / 32; ++w) total += part[w];
  __syncthreads();  // part[] may be reused by the next call
  return total;
}

// out[t·width + k] = Σ partials[i·width + k] over tensor t's slots [offsets[t], offsets[t+1]),
// one block per tensor, in a fixed order.
__global__ void reduce_slots(const double* partials, int width, const int64_t* offsets, double* out) {
  const int t = blockIdx.x;
  for (int k = 0; k < width; ++k) {
    double s = 0;
    for (int64_t i = offsets[t] + threadIdx.x; i < offsets[t + 1]; i += blockDim.x) s += partials[i * width + k];
    s = block_sum(s);
    if (threadIdx.x == 0) out[t * width + k] = s;
  }
}

template <typename P, typename G>
__global__ void lamb_pass1(Meta<4> m, LambArgs host, double* partials, int64_t first_slot) {
  if (skipped(host.dev)) return;  // the whole block: block_sum is never reached
  const LambArgs a = lamb_for_step(host);
  const float grad_scale = grad_factor(a.dev, a.grad_scale);
  int t;
  int64_t begin, end;
  chunk_of(m, t, begin, end);
  const P* p = static_cast<const P*>(m.ptr[0][t]);
  const G* g = static_cast<const G*>(m.ptr[1][t]);
  float* ma = static_cast<float*>(m.ptr[2][t]);
  float* va = static_cast<float*>(m.ptr[3][t]);
  double pp = 0, uu = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float pi = load(p, i);
    float gi = mul(load(g, i), grad_scale);
    if (!a.adam_w) gi = add(gi, mul(a.wd, pi));
    const float mi = add(mul(a.b1, ma[i]), mul(a.m_weight, gi));
    const float vi = add(mul(a.b2, va[i]), mul(a.one_minus_b2, mul(gi, gi)));
    ma[i] = mi;
    va[i] = vi;
    const float u = lamb_update(pi, mi, vi, a);
    pp += double(pi) * pi;
    uu += double(u) * u;
  }
  pp = block_sum(pp);
  uu = block_sum(uu);
  if (threadIdx.x == 0) {
    partials[2 * (first_slot + blockIdx.x)] = pp;
    partials[2 * (first_slot + blockIdx.x) + 1] = uu;
  }
}

__global__ void lamb_ratios(const double* sums, float* scaled_lr, int n, LambArgs a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n || skipped(a.dev)) return;
  // The CPU kernel's std::min/std::max, written out: fmin/fmax would drop a nan instead.
  double w = sqrt(sums[2 * i]);
  if (a.max_weight_norm > 0 && a.max_weight_norm < w) w = a.max_weight_norm;
  const double un = sqrt(sums[2 * i + 1]);
  double ratio = 1.0;
  if (a.ratio_on) ratio = (w > 0 && un > 0) ? w / un : 1.0;
  if (ratio < a.ratio_min) ratio = a.ratio_min;
  if (a.ratio_max < ratio) ratio = a.ratio_max;
  scaled_lr[i] = float(a.lr * ratio);
}

template <typename P>
__global__ void lamb_pass2(Meta<4> m, LambArgs host, const float* scaled_lr) {
  if (skipped(host.dev)) return;
  const LambArgs a = lamb_for_step(host);
  int t;
  int64_t begin, end;
  chunk_of(m, t, begin, end);
  P* p = static_cast<P*>(m.ptr[0][t]);
  const float* ma = static_cast<const float*>(m.ptr[2][t]);
  const float* va = static_cast<const float*>(m.ptr[3][t]);
  const float lr = scaled_lr[m.index[t]];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float pi = load(p, i);
    store(p, i, pi - mul(lr, lamb_update(pi, ma[i], va[i], a)));
  }
}

template <typename S, typename D>
__global__ void scale_kernel(Meta<2> m, double scale, const double* scale_by, float* found) {
  const float factor = scale_by != nullptr ? float(scale * *scale_by) : float(scale);
  int t;
  int64_t begin, end;
  chunk_of(m, t, begin, end);
  const S* s = static_cast<const S*>(m.ptr[0][t]);
  D* d = static_cast<D*>(m.ptr[1][t]);
  bool bad = false;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float x = load(s, i);
    bad |= !isfinite(x);
    store(d, i, mul(x, factor));
  }
  if (bad) *found = 1.0f;
}

template <typename T>
__global__ void sum_squares_kernel(Meta<1> m, double* partials, int64_t first_slot) {
  int t;
  int64_t begin, end;
  chunk_of(m, t, begin, end);
  const T* x = static_cast<const T*>(m.ptr[0][t]);
  double s = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = load(x, i);
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[first_slot + blockIdx.x] = s;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Packs every chunk of every non-empty tensor into launches of at most kMaxTensors tensors and
// kMaxBlocks blocks, calling launch(meta, blocks, first_slot) for each, first_slot being the
// number of blocks launched before (chunk_offsets' numbering). A tensor whose chunks span two
// launches keeps going in slot 0 of the next.
template <int kDepth, typename F>
void for_launches(const Lists& l, const F& launch) {
  Meta<kDepth> m{};
  int used = 0, blocks = 0;  // tensor slots and blocks filled in m
  int64_t launched = 0;      // blocks of earlier launches
  auto go = [&] {
    launch(m, blocks, launched);
    launched += blocks;
  };
  auto put = [&](int slot, int t) {
    for (int d = 0; d < kDepth; ++d) m.ptr[d][slot] = l.ptrs[d][t];
    m.numel[slot] = l.numel[t];
    m.index[slot] = t;
  };
  for (int t = 0; t < int(l.numel.size()); ++t) {
    if (l.numel[t] == 0) continue;
    if (used == Meta<kDepth>::kMaxTensors) {
      go();
      used = blocks = 0;
    }
    const int slot = used++;
    put(slot, t);
    const int chunks = int((l.numel[t] + kChunk - 1) / kChunk);
    for (int c = 0; c < chunks; ++c) {
      m.block_tensor[blocks] = static_cast<unsigned char>(used - 1);
      m.block_chunk[blocks] = c;
      if (++blocks < kMaxBlocks) continue;
      go();
      blocks = 0;
      used = 0;
      if (c + 1 < chunks) {
        put(0, t);
        used = 1;
      }
    }
  }
  if (blocks) go();
}

int64_t chunks_of(int64_t numel) { return (numel + kChunk - 1) / kChunk; }

template <typename F>
void with_elem(Elem e, const F& f) {
  switch (e) {
    case Elem::kF32: return f(static_cast<float*>(nullptr));
    case Elem::kF16: return f(static_cast<__half*>(nullptr));
    case Elem::kBF16: return f(static_cast<__nv_bfloat16*>(nullptr));
  }
  throw std::invalid_argument("unknown element type");
}

}  // namespace

void adam(const Lists& l, Elem pe, Elem ge, const AdamArgs& a, cudaStream_t stream) {
  with_elem(pe, [&](auto* p0) {
    with_elem(ge, [&](auto* g0) {
      using P = std::remove_pointer_t<decltype(p0)>;
      using G = std::remove_pointer_t<decltype(g0)>;
      for_launches<4>(l, [&](const Meta<4>& m, int blocks, int64_t) {
        if (a.mode == 0) adam_kernel<P, G, 0><<<blocks, kThreads, 0, stream>>>(m, a);
        else if (a.mode == 1) adam_kernel<P, G, 1><<<blocks, kThreads, 0, stream>>>(m, a);
        else adam_kernel<P, G, 2><<<blocks, kThreads, 0, stream>>>(m, a);
      });
    });
  });
  check(cudaGetLastError(), "multi_tensor_adam launch");
}

void lamb(const Lists& l, Elem pe, Elem ge, const LambArgs& a, double* partials, const int64_t* offsets,
          double* sums, float* scaled_lr, cudaStream_t stream) {
  const int n = int(l.numel.size());
  with_elem(pe, [&](auto* p0) {
    using P = std::remove_pointer_t<decltype(p0)>;
    with_elem(ge, [&](auto* g0) {
      using G = std::remove_pointer_t<decltype(g0)>;
      for_launches<4>(l, [&](const Meta<4>& m, int blocks, int64_t first_slot) {
        lamb_pass1<P, G><<<blocks, kThreads, 0, stream>>>(m, a, partials, first_slot);
      });
    });
    // Same stream: each kernel starts after the previous one has finished.
    reduce_slots<<<n, kThreads, 0, stream>>>(partials, 2, offsets, sums);
    lamb_ratios<<<(n + 255) / 256, 256, 0, stream>>>(sums, scaled_lr, n, a);
    for_launches<4>(l, [&](const Meta<4>& m, int blocks, int64_t) {
      lamb_pass2<P><<<blocks, kThreads, 0, stream>>>(m, a, scaled_lr);
    });
  });
  check(cudaGetLastError(), "multi_tensor_lamb launch");
}

void scale(const Lists& l, Elem se, Elem de, double factor, const double* scale_by, float* found,
           cudaStream_t stream) {
  with_elem(se, [&](auto* s0) {
    with_elem(de, [&](auto* d0) {
      using S = std::remove_pointer_t<decltype(s0)>;
      using D = std::remove_pointer_t<decltype(d0)>;
      for_launches<2>(l, [&](const Meta<2>& m, int blocks, int64_t) {
        scale_kernel<S, D><<<blocks, kThreads, 0, stream>>>(m, factor, scale_by, found);
      });
    });
  });
  check(cudaGetLastError(), "multi_tensor_scale launch");
}

void sum_squares(const Lists& l, Elem te, double* partials, const int64_t* offsets, double* sum,
                 cudaStream_t stream) {
  with_elem(te, [&](auto* t0) {
    using T = std::remove_pointer_t<decltype(t0)>;
    for_launches<1>(l, [&](const Meta<1>& m, int blocks, int64_t first_slot) {
      sum_squares_kernel<T><<<blocks, kThreads, 0, stream>>>(m, partials, first_slot);
    });
  });
  reduce_slots<<<1, kThreads, 0, stream>>>(partials, 1, offsets, sum);
  check(cudaGetLastError(), "multi_tensor_l2norm launch");
}

std::vector<int64_t> chunk_offsets(const Lists& l) {
  std::vector<int64_t> out(l.numel.size() + 1, 0);
  for (size_t t = 0; t < l.numel.size(); ++t) out[t + 1] = out[t] + chunks_of(l.numel[t]);
  return out;
}

}  // namespace torch_ort::optim::cuda
