// Kernels of com.torch_ort::BiasGelu(X, [bias]) -> Y = gelu(X + bias) and BiasGeluGrad(dY, X, [bias])
// -> dX = dY · gelu'(X + bias) (bias_gelu_fusion.cc makes them), one pass over memory each: fp32
// CPU tensors take cpu/gelu.cc's AVX-512 loop, CUDA tensors the CUDA kernel when torch_ort._C_cuda
// registered one (fused_gelu.h). Everything else (fp16/bf16/fp64, a CPU without AVX-512, no CUDA
// build) runs the unfused ATen reference gelu(x + b), which the tests compare the loops with.
#include <string>

#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>

#include "csrc/runtime/kernel.h"
#include "csrc/runtime/kernels/cpu/gelu.h"
#include "csrc/runtime/kernels/cuda_table.h"
#include "csrc/runtime/kernels/fused_gelu.h"

namespace torch_ort::kernels {
namespace {

struct GeluArgs {
  at::Tensor x;     // contiguous
  at::Tensor bias;  // undefined, or contiguous 1-D of x.size(-1)
  bool tanh;
  std::string approximate;
};

// Reads (X, [bias]) at input offset `first` and the approximate attribute; errors name the node.
GeluArgs gelu_args(const KernelCtx& c, int first) {
  GeluArgs a;
  a.approximate = c.attrs.get_string("approximate", "none");
  if (a.approximate != "none" && a.approximate != "tanh")
    c.fail("approximate must be 'none' or 'tanh', got '" + a.approximate + "'");
  a.tanh = a.approximate == "tanh";
  a.x = c.input(first);
  if (!a.x.is_floating_point()) c.fail("X must be a float tensor, got " + std::string(c10::toString(a.x.scalar_type())));
  if (c.has_input(first + 1)) {
    a.bias = c.input(first + 1);
    if (a.x.dim() < 1 || a.bias.dim() != 1 || a.bias.size(0) != a.x.size(-1))
      c.fail("bias must be 1-D of X's last dim: X " + c10::str(a.x.sizes()) + ", bias " + c10::str(a.bias.sizes()));
    if (a.bias.scalar_type() != a.x.scalar_type() || a.bias.device() != a.x.device())
      c.fail("bias must match X's dtype and device");
    a.bias = a.bias.contiguous();
  }
  a.x = a.x.contiguous();
  return a;
}

at::Tensor biased(const GeluArgs& a) { return a.bias.defined() ? at::add(a.x, a.bias) : a.x; }

// The AVX-512 loop wins where GELU is memory-bound; the exact (erf) form costs more arithmetic per
// element than ATen's, and lost (0.8x) on cache-resident tensors (fused_kernels.md: 768x512 vs
// 2048x1536), so below ~1M elements the exact form stays on ATen. The tanh form wins at every size.
constexpr int64_t kExactLoopMinNumel = int64_t(1) << 20;

bool cpu_loop(const GeluArgs& a) {
  return a.x.device().is_cpu() && a.x.scalar_type() == at::kFloat &&
         (a.tanh || a.x.numel() >= kExactLoopMinNumel);
}
bool cuda_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

void bias_gelu_kernel(KernelCtx& c) {
  const GeluArgs a = gelu_args(c, 0);
  const float* b = nullptr;
  if (cpu_loop(a)) {
    at::Tensor y = at::empty_like(a.x);
    if (a.bias.defined()) b = a.bias.data_ptr<float>();
    if (cpu::bias_gelu_forward(a.x.data_ptr<float>(), b, y.data_ptr<float>(), a.x.numel(),
                               a.x.dim() ? a.x.size(-1) : 1, a.tanh))
      return c.set_output(0, y);
  }
  if (a.x.is_cuda() && cuda_dtype(a.x)) {
    if (auto fn = cuda_kernel<BiasGeluCudaFn>("BiasGelu")) {
      at::Tensor y = at::empty_like(a.x);
      fn(a.x, a.bias, y, a.tanh);
      return c.set_output(0, y);
    }
  }
  c.set_output(0, at::gelu(biased(a), a.approximate));  // the unfused reference
}

// (dY, X, [bias]) -> dX
void bias_gelu_grad_kernel(KernelCtx& c) {
  const GeluArgs a = gelu_args(c, 1);
  const at::Tensor dy = c.input(0).contiguous();
  if (dy.sizes() != a.x.sizes() || dy.scalar_type() != a.x.scalar_type())
    c.fail("dY " + c10::str(dy.sizes()) + " must match X " + c10::str(a.x.sizes()) + " in shape and dtype");
  if (cpu_loop(a) && dy.device().is_cpu()) {
    at::Tensor dx = at::empty_like(a.x);
    if (cpu::bias_gelu_backward(dy.data_ptr<float>(), a.x.data_ptr<float>(),
                                a.bias.defined() ? a.bias.data_ptr<float>() : nullptr, dx.data_ptr<float>(),
                                a.x.numel(), a.x.dim() ? a.x.size(-1) : 1, a.tanh))
      return c.set_output(0, dx);
  }
  if (a.x.is_cuda() && cuda_dtype(a.x)) {
    if (auto fn = cuda_kernel<BiasGeluGradCudaFn>("BiasGeluGrad")) {
      at::Tensor dx = at::empty_like(a.x);
      fn(dy, a.x, a.bias, dx, a.tanh);
      return c.set_output(0, dx);
    }
  }
  c.set_output(0, at::gelu_backward(dy, biased(a), a.approximate));  // the unfused reference
}

}  // namespace

REGISTER_KERNEL_IN(kOurDomain, "BiasGelu", bias_gelu_kernel);
REGISTER_KERNEL_IN(kOurDomain, "BiasGeluGrad", bias_gelu_grad_kernel);

}  // namespace torch_ort::kernels
