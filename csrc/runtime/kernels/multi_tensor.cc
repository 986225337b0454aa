// Argument checks and step terms shared by the CPU and CUDA multi-tensor kernels.
#include "csrc/runtime/kernels/multi_tensor.h"

#include <cmath>
#include <stdexcept>

#include "csrc/runtime/errors.h"

namespace torch_ort::optim {
namespace {

bool low_or_full_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

std::string where(const char* call, const char* list, size_t i) {
  return std::string(call) + ": " + list + "[" + std::to_string(i) + "]";
}

}  // namespace

void check_scalar(const char* call, const char* name, const at::Tensor& t, at::ScalarType dtype,
                  const c10::Device& device) {
  if (!t.defined()) return;
  if (t.numel() != 1 || t.scalar_type() != dtype || t.device() != device)
    throw InputMismatchError(std::string(call) + ": " + name + " must be one " +
                             std::string(c10::toString(dtype)) + " element on " + device.str() + ", got " +
                             std::to_string(t.numel()) + " " + std::string(c10::toString(t.scalar_type())) +
                             " element(s) on " + t.device().str());
}

void check_lists(const char* call, const std::vector<const std::vector<at::Tensor>*>& lists,
                 const std::vector<const char*>& names, size_t param_like, c10::DeviceType device) {
  const std::vector<at::Tensor>& first = *lists.at(0);
  for (size_t l = 0; l < lists.size(); ++l) {
    const std::vector<at::Tensor>& list = *lists[l];
    if (list.size() != first.size())
      throw std::invalid_argument(std::string(call) + ": " + names[l] + " has " +
                                  std::to_string(list.size()) + " tensors, " + names[0] + " has " +
                                  std::to_string(first.size()));
    for (size_t i = 0; i < list.size(); ++i) {
      const at::Tensor& t = list[i];
      if (!t.defined()) throw std::invalid_argument(where(call, names[l], i) + " is None");
      if (t.layout() != at::kStrided)
        throw InputMismatchError(where(call, names[l], i) + " is sparse; these kernels take dense tensors");
      if (t.device().type() != device)
        throw InputMismatchError(where(call, names[l], i) + " is on " + t.device().str() +
                                 ", this kernel runs on " + c10::DeviceTypeName(device));
      if (t.device() != first[i].device())
        throw InputMismatchError(where(call, names[l], i) + " is on " + t.device().str() + ", " +
                                 names[0] + "[" + std::to_string(i) + "] on " + first[i].device().str());
      const bool ok = l < param_like ? low_or_full_float(t.scalar_type()) : t.scalar_type() == at::kFloat;
      if (!ok)
        throw InputMismatchError(where(call, names[l], i) + " has dtype " +
                                 std::string(c10::toString(t.scalar_type())) + "; expected " +
                                 (l < param_like ? "float32, float16 or bfloat16" : "float32"));
      if (t.numel() != first[i].numel())
        throw std::invalid_argument(where(call, names[l], i) + " has " + std::to_string(t.numel()) +
                                    " elements, " + names[0] + "[" + std::to_string(i) + "] has " +
                                    std::to_string(first[i].numel()));
      if (!t.is_contiguous())
        throw std::invalid_argument(where(call, names[l], i) + " is not contiguous");
    }
  }
}

void check_grad_dtypes(const char* call, const std::vector<at::Tensor>& params,
                       const std::vector<at::Tensor>& grads) {
  for (size_t i = 0; i < params.size(); ++i) {
    const at::ScalarType p = params[i].scalar_type(), g = grads[i].scalar_type();
    if (g != p && g != at::kFloat)
      throw InputMismatchError(where(call, "grads", i) + ": a " + std::string(c10::toString(g)) +
                               " gradient for a " + c10::toString(p) +
                               " parameter; expected the parameter's dtype or float32");
  }
}

AdamTerms adam_terms(const AdamHyper& h) {
  const double bc1 = h.bias_correction ? 1.0 - std::pow(h.beta1, double(h.step)) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - std::pow(h.beta2, double(h.step)) : 1.0;
  AdamTerms t{};
  switch (h.mode) {
    case AdamWMode::kAdamL2:
      t = {float(h.lr * std::sqrt(bc2) / bc1), 1.0f, 1.0f, float(h.weight_decay)};
      break;
    case AdamWMode::kAdamWTransformers:
      t = {float(h.lr * std::sqrt(bc2) / bc1), 1.0f, float(1.0 - h.lr * h.weight_decay), 0.0f};
      break;
    case AdamWMode::kAdamWTorch:
      t = {float(h.lr / bc1), float(1.0 / std::sqrt(bc2)), float(1.0 - h.lr * h.weight_decay), 0.0f};
      break;
    default:
      throw std::invalid_argument("adam_w_mode must be 0, 1 or 2, got " +
                                  std::to_string(int64_t(h.mode)));
  }
  return t;
}

LambTerms lamb_terms(const LambHyper& h) {
  const double bc1 = h.bias_correction ? 1.0 - std::pow(h.beta1, double(h.step)) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - std::pow(h.beta2, double(h.step)) : 1.0;
  return {float(h.grad_averaging ? 1.0 - h.beta1 : 1.0), float(1.0 / bc1), float(1.0 / bc2),
          h.use_nvlamb || h.weight_decay != 0.0};
}

}  // namespace torch_ort::optim
