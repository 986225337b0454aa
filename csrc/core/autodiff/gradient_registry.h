// One gradient rule per op, registered with one line in the op's family file,
// csrc/core/ops/<family>.cc (next to its traits line and its shape rule):
//   REGISTER_GRADIENT("MatMul", matmul_grad, {});          // no non-differentiable inputs
//   REGISTER_GRADIENT("Reshape", reshape_grad, {1});        // input 1 (the shape) never gets a gradient
//   NO_GRADIENT("Shape", "returns sizes, not values");      // outputs carry no gradient
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "csrc/core/autodiff/grad_ctx.h"
#include "csrc/core/ir/op_registry.h"

namespace torch_ort {

using GradientRule = std::function<void(GradCtx&)>;

struct GradientEntry {
  GradientRule rule;                     // empty for NO_GRADIENT ops
  std::vector<int> non_differentiable;   // input indices that never receive a gradient
  std::string no_gradient_reason;        // set for NO_GRADIENT ops
};

class GradientRegistry : public OpRegistry<GradientEntry> {
 public:
  static GradientRegistry& instance();
  const GradientEntry* find(const std::string& domain, const std::string& op) const {  // nullptr if none
    return entry(domain, op);
  }

 private:
  GradientRegistry() : OpRegistry("gradient") {}
};

#define TORCH_ORT_CONCAT_INNER(a, b) a##b
#define TORCH_ORT_CONCAT(a, b) TORCH_ORT_CONCAT_INNER(a, b)
#define REGISTER_GRADIENT_IN(domain, op, fn, ...)                                          \
  static const bool TORCH_ORT_CONCAT(kGradReg_, __COUNTER__) =                             \
      ::torch_ort::GradientRegistry::instance().add(domain, op, {fn, __VA_ARGS__, ""})
#define REGISTER_GRADIENT(op, fn, ...) REGISTER_GRADIENT_IN("", op, fn, __VA_ARGS__)
#define NO_GRADIENT(op, reason)                                                            \
  static const bool TORCH_ORT_CONCAT(kGradReg_, __COUNTER__) =                             \
      ::torch_ort::GradientRegistry::instance().add("", op, {nullptr, {}, reason})

}  // namespace torch_ort
