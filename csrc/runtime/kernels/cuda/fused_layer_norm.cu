// CUDA kernels of SkipLayerNorm and SkipLayerNormGrad (fp32): one block per row for the row-wise
// work (sum, statistics, normalisation, dX), then a deterministic column reduction for dGamma,
// dBeta and dBias (per-chunk partials in fixed slots, summed in chunk order). The element math is
// the CPU loops' (kernels/cpu/layer_norm.cc), in the same order. No torch headers here: the ATen
// glue is fused_layer_norm_cuda.cc, which declares the launchers below.
#include <cuda_runtime.h>

#include <cstdint>

namespace torch_ort::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kColTile = 32, kColRows = 8;

// Sum of v over the block (every thread gets it). `scratch` holds 32 floats.
__device__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? scratch[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void skip_ln_forward_kernel(const float* __restrict__ x, const float* __restrict__ skip,
                                       const float* __restrict__ bias, const float* __restrict__ gamma,
                                       const float* __restrict__ beta, float eps, int64_t cols,
                                       float* __restrict__ y, float* __restrict__ mean,
                                       float* __restrict__ invstd, float* __restrict__ sum) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x, o = row * cols;
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float v = x[o + j];
    if (bias) v = v + bias[j];
    v = v + skip[o + j];
    sum[o + j] = v;
    acc += v;
  }
  const float m = block_sum(acc, scratch) / static_cast<float>(cols);
  float acc2 = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {  // this thread's own writes
    const float d = sum[o + j] - m;
    acc2 += d * d;
  }
  const float rs = rsqrtf(block_sum(acc2, scratch) / static_cast<float>(cols) + eps);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float v = (sum[o + j] - m) * rs * gamma[j];
    if (beta) v = v + beta[j];
    y[o + j] = v;
  }
  if (threadIdx.x == 0) {
    mean[row] = m;
    invstd[row] = rs;
  }
}

__global__ void skip_ln_dx_kernel(const float* __restrict__ dy, const float* __restrict__ dsum,
                                  const float* __restrict__ sum, const float* __restrict__ gamma,
                                  const float* __restrict__ mean, const float* __restrict__ invstd,
                                  int64_t cols, float* __restrict__ dx) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x, o = row * cols;
  const float m = mean[row], rs = invstd[row];
  float a1 = 0.f, a2 = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float xh = (sum[o + j] - m) * rs, g = dy[o + j] * gamma[j];
    a1 += g;
    a2 += g * xh;
  }
  const float c1 = block_sum(a1, scratch) / static_cast<float>(cols);
  const float c2 = block_sum(a2, scratch) / static_cast<float>(cols);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float xh = (sum[o + j] - m) * rs, g = dy[o + j] * gamma[j];
    float v = rs * (g - c1 - xh * c2);
    if (dsum) v = v + dsum[o + j];
    dx[o + j] = v;
  }
}

// Block (kColTile, kColRows) over columns [32·bx, +32) and rows of chunk by; writes the chunk's
// three column sums to partial[(3·by + w)·cols + c].
__global__ void skip_ln_column_partials(const float* __restrict__ dy, const float* __restrict__ sum,
                                        const float* __restrict__ mean, const float* __restrict__ invstd,
                                        const float* __restrict__ dx, int64_t rows, int64_t cols,
                                        int64_t chunks, float* __restrict__ partial) {
  __shared__ float red[3][kColRows][kColTile];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows / chunks, r1 = (blockIdx.y + 1) * rows / chunks;
  float pg = 0.f, pb = 0.f, pd = 0.f;
  if (c < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) {
      const float d = dy[r * cols + c];
      pg += d * ((sum[r * cols + c] - mean[r]) * invstd[r]);
      pb += d;
      if (dx) pd += dx[r * cols + c];
    }
  }
  red[0][threadIdx.y][threadIdx.x] = pg;
  red[1][threadIdx.y][threadIdx.x] = pb;
  red[2][threadIdx.y][threadIdx.x] = pd;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int w = 0; w < 3; ++w) {
      float t = 0.f;
      for (int k = 0; k < kColRows; ++k) t += red[w][k][threadIdx.x];
      partial[(3 * blockIdx.y + w) * cols + c] = t;
    }
  }
}

__global__ void skip_ln_column_finish(const float* __restrict__ partial, int64_t cols, int64_t chunks,
                                      float* __restrict__ dgamma, float* __restrict__ dbeta,
                                      float* __restrict__ dbias) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float* outs[3] = {dgamma, dbeta, dbias};
  for (int w = 0; w < 3; ++w) {
    if (!outs[w]) continue;
    float t = 0.f;
    for (int64_t k = 0; k < chunks; ++k) t += partial[(3 * k + w) * cols + c];
    outs[w][c] = t;
  }
}

int row_threads(int64_t cols) {
  int t = 32;
  while (t < kRowThreads && t < cols) t <<= 1;
  return t;
}

}  // namespace

// Launchers (declared in fused_layer_norm_cuda.cc). rows, cols > 0; every pointer device fp32.
void skip_layer_norm_forward(const float* x, const float* skip, const float* bias, const float* gamma,
                             const float* beta, float eps, int64_t rows, int64_t cols, float* y, float* mean,
                             float* invstd, float* sum, cudaStream_t stream) {
  skip_ln_forward_kernel<<<static_cast<unsigned>(rows), row_threads(cols), 0, stream>>>(
      x, skip, bias, gamma, beta, eps, cols, y, mean, invstd, sum);
}

// Number of row chunks of the column reduction (the caller sizes `partial` as 3·chunks·cols).
int64_t skip_layer_norm_grad_chunks(int64_t rows) { return rows < 64 ? rows : 64; }

void skip_layer_norm_backward(const float* dy, const float* dsum, const float* sum, const float* gamma,
                              const float* mean, const float* invstd, int64_t rows, int64_t cols, float* dx,
                              float* dgamma, float* dbeta, float* dbias, float* partial,
                              cudaStream_t stream) {
  skip_ln_dx_kernel<<<static_cast<unsigned>(rows), row_threads(cols), 0, stream>>>(dy, dsum, sum, gamma, mean,
                                                                                   invstd, cols, dx);
  if (!dgamma && !dbeta && !dbias) return;
  const int64_t chunks = skip_layer_norm_grad_chunks(rows);
  const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile), static_cast<unsigned>(chunks));
  skip_ln_column_partials<<<grid, dim3(kColTile, kColRows), 0, stream>>>(
      dy, sum, mean, invstd, dbias ? dx : nullptr, rows, cols, chunks, partial);
  skip_ln_column_finish<<<static_cast<unsigned>((cols + 255) / 256), 256, 0, stream>>>(partial, cols, chunks,
                                                                                       dgamma, dbeta, dbias);
}

}  // namespace torch_ort::cuda
