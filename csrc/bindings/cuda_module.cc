// torch_ort._C_cuda: the CUDA multi-tensor optimizer kernels, built only when the CUDA toolkit is
// present (setup.py). Same functions and arguments as torch_ort._C's CPU ones. Importing it also
// hands the CUDA implementations of our fused graph kernels to torch_ort._C (kernels/cuda_table.h).
#include "csrc/bindings/multi_tensor_bindings.h"
#include "csrc/runtime/kernels/cuda/fused_registry.h"
#include "csrc/runtime/errors.h"

PYBIND11_MODULE(_C_cuda, m) {
  m.doc() = "torch_ort CUDA multi-tensor optimizer kernels";
  pybind11::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const torch_ort::InputMismatchError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    }
  });
  using Register = void (*)(const char*, void*);
  pybind11::capsule table = pybind11::module_::import("torch_ort._C").attr("_cuda_kernel_table")();
  auto reg = reinterpret_cast<Register>(table.get_pointer());
  for (const auto& [name, fn] : torch_ort::cuda::fused_kernels()) reg(name, fn);
  namespace o = torch_ort::optim;
  o::bind_multi_tensor(m, {&o::adam_cuda_scalars, &o::lamb_cuda_scalars, &o::scale_cuda, &o::l2norm_cuda,
                           &o::scale_flag_cuda, &o::l2norm_tensor_cuda});
}
