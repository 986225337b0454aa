// Nodes whose backward is PyTorch autograd (ATenOp, PythonOp; csrc/core/ir/aten_op.h):
// the forward runs the callee against fresh leaves with grad mode on when a gradient will be asked
// for, and hands the results' autograd history to the ATenOpGrad kernel through the saved set.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {

// (arguments: node input i, or its leaf where one was made; record: grad mode on) -> results.
using AutogradCallee = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&, bool)>;

// Runs `callee` and sets the node's outputs: results [0, n) detached, [n, 2n) with history and
// [2n, 2n + inputs) the leaves, as aten_op.h lays them out. `what` names the callee in errors.
void run_recording_autograd(KernelCtx& c, const std::string& what, const AutogradCallee& callee);

}  // namespace torch_ort::kernels
