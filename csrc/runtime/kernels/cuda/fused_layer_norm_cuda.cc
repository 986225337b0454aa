// ATen glue of the CUDA SkipLayerNorm kernels (fused_layer_norm.cu): checks, the current stream,
// scratch for the column reduction, and the registration with torch_ort._C's table under the
// names fused_layer_norm.h gives (the _C kernel falls back to its ATen reference without them).
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>

#include <string>

#include "csrc/runtime/kernels/cuda/fused_registry.h"
#include "csrc/runtime/kernels/fused_layer_norm.h"

namespace torch_ort::cuda {

// Launchers in fused_layer_norm.cu (plain pointers; rows, cols > 0).
void skip_layer_norm_forward(const float* x, const float* skip, const float* bias, const float* gamma,
                             const float* beta, float eps, int64_t rows, int64_t cols, float* y, float* mean,
                             float* invstd, float* sum, cudaStream_t stream);
int64_t skip_layer_norm_grad_chunks(int64_t rows);
void skip_layer_norm_backward(const float* dy, const float* dsum, const float* sum, const float* gamma,
                              const float* mean, const float* invstd, int64_t rows, int64_t cols, float* dx,
                              float* dgamma, float* dbeta, float* dbias, float* partial, cudaStream_t stream);

namespace {

// Every tensor the kernels read or write: fp32, contiguous, on x's device (the _C caller ensures
// it; checked again because a wrong pointer here is a crash, not an error).
void check(const at::Tensor& t, const at::Tensor& like, const char* what) {
  if (!t.defined()) return;
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device() == like.device(),
              "SkipLayerNorm (CUDA): ", what, " must be a contiguous float32 tensor on ", like.device());
}

const float* ptr(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }
float* mptr(at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

void skip_layer_norm_cuda(const at::Tensor& x, const at::Tensor& skip, const at::Tensor& gamma,
                          const at::Tensor& beta, const at::Tensor& bias, double eps, at::Tensor& y,
                          at::Tensor& mean, at::Tensor& invstd, at::Tensor& sum) {
  for (auto [t, what] : {std::pair{&x, "X"},
                         {&skip, "Skip"},
                         {&gamma, "Gamma"},
                         {&beta, "Beta"},
                         {&bias, "Bias"},
                         {static_cast<const at::Tensor*>(&y), "Y"},
                         {&mean, "Mean"},
                         {&invstd, "InvStdDev"},
                         {&sum, "Sum"}})
    check(*t, x, what);
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  const c10::cuda::CUDAGuard guard(x.device());
  skip_layer_norm_forward(ptr(x), ptr(skip), ptr(bias), ptr(gamma), ptr(beta), static_cast<float>(eps), rows,
                          cols, mptr(y), mptr(mean), mptr(invstd), mptr(sum),
                          at::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void skip_layer_norm_grad_cuda(const at::Tensor& dy, const at::Tensor& dsum, const at::Tensor& sum,
                               const at::Tensor& gamma, const at::Tensor& mean, const at::Tensor& invstd,
                               at::Tensor& dx, at::Tensor& dgamma, at::Tensor& dbeta, at::Tensor& dbias) {
  for (auto [t, what] : {std::pair{&dy, "dY"},
                         {&dsum, "dSum"},
                         {&sum, "Sum"},
                         {&gamma, "Gamma"},
                         {&mean, "Mean"},
                         {&invstd, "InvStdDev"},
                         {static_cast<const at::Tensor*>(&dx), "dX"},
                         {&dgamma, "dGamma"},
                         {&dbeta, "dBeta"},
                         {&dbias, "dBias"}})
    check(*t, sum, what);
  const int64_t cols = sum.size(-1), rows = sum.numel() / cols;
  const c10::cuda::CUDAGuard guard(sum.device());
  const int64_t chunks = skip_layer_norm_grad_chunks(rows);
  at::Tensor partial = at::empty({3 * chunks * cols}, sum.options());
  skip_layer_norm_backward(ptr(dy), ptr(dsum), ptr(sum), ptr(gamma), ptr(mean), ptr(invstd), rows, cols,
                           mptr(dx), mptr(dgamma), mptr(dbeta), mptr(dbias), partial.data_ptr<float>(),
                           at::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The table's entries must have exactly the signatures fused_layer_norm.h declares.
static_assert(std::is_same_v<decltype(&skip_layer_norm_cuda), SkipLayerNormCudaFn>);
static_assert(std::is_same_v<decltype(&skip_layer_norm_grad_cuda), SkipLayerNormGradCudaFn>);

}  // namespace

REGISTER_FUSED_CUDA(kSkipLayerNormCuda, skip_layer_norm_cuda);
REGISTER_FUSED_CUDA(kSkipLayerNormGradCuda, skip_layer_norm_grad_cuda);

}  // namespace torch_ort::cuda
