// The argument checks and step terms the CUDA kernels share with the CPU ones
// (kernels/multi_tensor.cc), compiled into torch_ort._C_cuda as an object of its own: setuptools
// names objects by source path, and one source in two extensions would rebuild on every build.
#include "csrc/runtime/kernels/multi_tensor.cc"  // NOLINT(bugprone-suspicious-include)
