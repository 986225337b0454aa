// The process-wide table of gradient rules, filled by REGISTER_GRADIENT lines at static init.
#include "csrc/core/autodiff/gradient_registry.h"

#include <stdexcept>

namespace torch_ort {

GradientRegistry& GradientRegistry::instance() {
  static GradientRegistry r;  // function-local: safe under any static-init order
  return r;
}

}  // namespace torch_ort
