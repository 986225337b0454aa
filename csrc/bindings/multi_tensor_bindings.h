// The Python face of the multi-tensor optimizer kernels, shared by torch_ort._C (CPU kernels) and
// torch_ort._C_cuda (CUDA kernels): both expose the same functions with the same arguments, and
// torch_ort/optim/_kernels.py picks one by the tensors' device. The GIL is released while they run.
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <optional>

#include <pybind11/stl.h>

#include "csrc/runtime/kernels/multi_tensor.h"

namespace torch_ort::optim {

using TensorList = std::vector<at::Tensor>;

struct KernelSet {
  void (*adam)(const TensorList&, const TensorList&, const TensorList&, const TensorList&, const AdamHyper&,
               const StepScalars&);
  void (*lamb)(const TensorList&, const TensorList&, const TensorList&, const TensorList&, const LambHyper&,
               const StepScalars&);
  bool (*scale)(const TensorList&, const TensorList&, double);
  double (*l2norm)(const TensorList&);
  void (*scale_flag)(const TensorList&, const TensorList&, double, const at::Tensor&, const at::Tensor&);
  at::Tensor (*l2norm_tensor)(const TensorList&);
};

inline at::Tensor or_undefined(const std::optional<at::Tensor>& t) { return t ? *t : at::Tensor(); }

inline void bind_multi_tensor(pybind11::module_& m, KernelSet k) {
  namespace py = pybind11;
  m.def("multi_tensor_adam",
        [k](const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
            const TensorList& exp_avg_sqs, double lr, double beta1, double beta2, double eps,
            double weight_decay, int64_t step, bool bias_correction, int64_t adam_w_mode,
            double grad_scale, const std::optional<at::Tensor>& scale_by,
            const std::optional<at::Tensor>& skip, const std::optional<at::Tensor>& step_tensor) {
          const AdamHyper h{lr, beta1, beta2, eps, weight_decay, step, bias_correction,
                            AdamWMode(adam_w_mode), grad_scale};
          const StepScalars d{or_undefined(scale_by), or_undefined(skip), or_undefined(step_tensor)};
          py::gil_scoped_release nogil;
          k.adam(params, grads, exp_avgs, exp_avg_sqs, h, d);
        },
        py::arg("params"), py::arg("grads"), py::arg("exp_avgs"), py::arg("exp_avg_sqs"), py::kw_only(),
        py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"),
        py::arg("step"), py::arg("bias_correction"), py::arg("adam_w_mode"), py::arg("grad_scale") = 1.0,
        py::arg("scale_by") = py::none(), py::arg("skip") = py::none(),
        py::arg("step_tensor") = py::none(),
        "One Adam step over every tensor of the lists, in place (params, exp_avgs, exp_avg_sqs).");
  m.def("multi_tensor_lamb",
        [k](const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
            const TensorList& exp_avg_sqs, double lr, double beta1, double beta2, double eps,
            double weight_decay, int64_t step, bool bias_correction, bool adam_w_mode,
            bool grad_averaging, bool use_nvlamb, double ratio_min, double ratio_max,
            double max_weight_norm, double grad_scale, const std::optional<at::Tensor>& scale_by,
            const std::optional<at::Tensor>& skip, const std::optional<at::Tensor>& step_tensor) {
          const LambHyper h{lr, beta1, beta2, eps, weight_decay, step, bias_correction, adam_w_mode,
                            grad_averaging, use_nvlamb, ratio_min, ratio_max, max_weight_norm,
                            grad_scale};
          const StepScalars d{or_undefined(scale_by), or_undefined(skip), or_undefined(step_tensor)};
          py::gil_scoped_release nogil;
          k.lamb(params, grads, exp_avgs, exp_avg_sqs, h, d);
        },
        py::arg("params"), py::arg("grads"), py::arg("exp_avgs"), py::arg("exp_avg_sqs"), py::kw_only(),
        py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"),
        py::arg("step"), py::arg("bias_correction"), py::arg("adam_w_mode"), py::arg("grad_averaging"),
        py::arg("use_nvlamb"), py::arg("ratio_min"), py::arg("ratio_max"), py::arg("max_weight_norm"),
        py::arg("grad_scale") = 1.0, py::arg("scale_by") = py::none(), py::arg("skip") = py::none(),
        py::arg("step_tensor") = py::none(),
        "One LAMB step over every tensor of the lists, in place; trust ratios per tensor.");
  m.def("multi_tensor_scale",
        [k](const TensorList& src, const TensorList& dst, double scale) {
          py::gil_scoped_release nogil;
          return k.scale(src, dst, scale);
        },
        py::arg("src"), py::arg("dst"), py::arg("scale"),
        "dst[i] = src[i] * scale (dtypes converted; dst may be src) -> True if src held inf or nan.");
  m.def("multi_tensor_l2norm",
        [k](const TensorList& tensors) {
          py::gil_scoped_release nogil;
          return k.l2norm(tensors);
        },
        py::arg("tensors"), "sqrt(sum of squares of every element of every tensor), in double.");
  m.def("multi_tensor_scale_flag",
        [k](const TensorList& src, const TensorList& dst, double scale, const std::optional<at::Tensor>& found,
            const std::optional<at::Tensor>& scale_by) {
          py::gil_scoped_release nogil;
          k.scale_flag(src, dst, scale, or_undefined(scale_by), or_undefined(found));
        },
        py::arg("src"), py::arg("dst"), py::arg("scale"), py::arg("found") = py::none(),
        py::arg("scale_by") = py::none(),
        "dst[i] = src[i] * scale * scale_by; found[0] = 1 when src held inf or nan. Never waits.");
  m.def("multi_tensor_l2norm_tensor",
        [k](const TensorList& tensors) {
          py::gil_scoped_release nogil;
          return k.l2norm_tensor(tensors);
        },
        py::arg("tensors"), "multi_tensor_l2norm as a 0-dim float64 tensor on the tensors' device.");
}

}  // namespace torch_ort::optim
