// com.torch_ort::PythonOp: calls the registered torch.autograd.Function through the Python
// callback (csrc/runtime/python_op.h). Its backward is the ATenOpGrad kernel: autograd backward over
// the recorded results runs the Function's own backward(ctx, *grads), once.
#include <string>
#include <utility>

#include "csrc/core/ir/aten_op.h"
#include "csrc/runtime/kernels/autograd_node.h"
#include "csrc/runtime/python_op.h"

namespace torch_ort {

namespace {
PythonOpRunner& runner_slot() {
  static PythonOpRunner runner;
  return runner;
}
}  // namespace

void set_python_op_runner(PythonOpRunner runner) { runner_slot() = std::move(runner); }
const PythonOpRunner& python_op_runner() { return runner_slot(); }

namespace kernels {
namespace {

void python_op_kernel(KernelCtx& c) {
  const std::string what = "PythonOp '" + c.attrs.get_string("name", "?") + "'";
  const int64_t id = c.attrs.get_int("func_id", -1);
  const PythonOpRunner& runner = python_op_runner();
  if (!runner) c.fail(what + ": no Python runner is installed (import torch_ort first)");
  run_recording_autograd(c, what, [&](const std::vector<at::Tensor>& args, bool record) {
    return runner(id, args, record);
  });
}

}  // namespace

REGISTER_KERNEL_IN(kOurDomain, kPythonOp, python_op_kernel);

}  // namespace kernels
}  // namespace torch_ort
