// ATen glue of the CUDA BiasGelu kernels (fused_gelu.cu): checks the tensors, picks the element
// type, launches on the current stream of x's device, and registers both entry points under the
// signatures of kernels/fused_gelu.h for torch_ort._C to find (cuda_table.h).
#include <cstdint>
#include <string>
#include <type_traits>

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "csrc/runtime/errors.h"
#include "csrc/runtime/kernels/cuda/fused_registry.h"
#include "csrc/runtime/kernels/fused_gelu.h"

namespace torch_ort::kernels::cuda {

// Defined in fused_gelu.cu.
void bias_gelu_launch(const void* x, const void* bias, void* y, int64_t n, int64_t c, int elem, bool tanh,
                      cudaStream_t stream);
void bias_gelu_grad_launch(const void* dy, const void* x, const void* bias, void* dx, int64_t n, int64_t c,
                           int elem, bool tanh, cudaStream_t stream);

namespace {

int elem_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return 0;
    case at::kHalf: return 1;
    case at::kBFloat16: return 2;
    default:
      throw InputMismatchError("BiasGelu CUDA: dtype " + std::string(c10::toString(t.scalar_type())) +
                               "; expected float32, float16 or bfloat16");
  }
}

// The contract of fused_gelu.h; the caller (fused_gelu.cc) already checked shapes, this guards
// the raw pointers.
void check_like(const at::Tensor& t, const at::Tensor& x, const char* what) {
  if (!t.is_cuda() || !t.is_contiguous() || t.scalar_type() != x.scalar_type() || t.device() != x.device())
    throw InputMismatchError(std::string("BiasGelu CUDA: ") + what + " must be a contiguous CUDA tensor of X's dtype and device");
}

int64_t last_dim(const at::Tensor& x, const at::Tensor& bias) {
  if (!bias.defined()) return 1;
  check_like(bias, x, "bias");
  if (x.dim() < 1 || bias.dim() != 1 || bias.size(0) != x.size(-1))
    throw InputMismatchError("BiasGelu CUDA: bias must be 1-D of X's last dim");
  return x.size(-1);
}

void bias_gelu_cuda(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& y, bool tanh) {
  check_like(x, x, "X");
  check_like(y, x, "Y");
  const int64_t c = last_dim(x, bias);
  const c10::cuda::CUDAGuard guard(x.device());
  bias_gelu_launch(x.data_ptr(), bias.defined() ? bias.data_ptr() : nullptr, y.data_ptr(), x.numel(), c,
                   elem_of(x), tanh, at::cuda::getCurrentCUDAStream(x.device().index()).stream());
}

void bias_gelu_grad_cuda(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& bias, const at::Tensor& dx,
                         bool tanh) {
  check_like(x, x, "X");
  check_like(dy, x, "dY");
  check_like(dx, x, "dX");
  const int64_t c = last_dim(x, bias);
  const c10::cuda::CUDAGuard guard(x.device());
  bias_gelu_grad_launch(dy.data_ptr(), x.data_ptr(), bias.defined() ? bias.data_ptr() : nullptr, dx.data_ptr(),
                        x.numel(), c, elem_of(x), tanh, at::cuda::getCurrentCUDAStream(x.device().index()).stream());
}

// The signatures torch_ort._C casts the registered pointers back to.
static_assert(std::is_same_v<decltype(&bias_gelu_cuda), BiasGeluCudaFn>);
static_assert(std::is_same_v<decltype(&bias_gelu_grad_cuda), BiasGeluGradCudaFn>);

REGISTER_FUSED_CUDA("BiasGelu", bias_gelu_cuda);
REGISTER_FUSED_CUDA("BiasGeluGrad", bias_gelu_grad_cuda);

}  // namespace
}  // namespace torch_ort::kernels::cuda
