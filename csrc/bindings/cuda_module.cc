// torch_ort._C_cuda: the CUDA multi-tensor optimizer kernels, built only when the CUDA toolkit is
// present (setup.py). Same functions and arguments as torch_ort._C's CPU ones.
#include "csrc/bindings/multi_tensor_bindings.h"
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
  torch_ort::optim::bind_multi_tensor(m, {&torch_ort::optim::adam_cuda, &torch_ort::optim::lamb_cuda,
                                          &torch_ort::optim::scale_cuda, &torch_ort::optim::l2norm_cuda});
}
