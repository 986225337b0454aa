// com.torch_ort::PythonOp: a user torch.autograd.Function kept opaque through export. The node
// carries only a registry id (attribute func_id) and a name; the Function, its non-tensor
// arguments and its output structure live in this process's registry
// (torch_ort/ortmodule/export/python_op.py), never in the model file. The runtime reaches that registry
// through one callback, installed by the Python bindings, so this layer stays free of pybind11.
#pragma once

#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch_ort {

// (func_id, arguments in node-input order (undefined: an omitted input), record) -> results.
// With record set the caller has grad mode on and the arguments it differentiates against are
// leaves requiring grad: the Function's apply() then records its backward as in eager.
using PythonOpRunner =
    std::function<std::vector<at::Tensor>(int64_t, const std::vector<at::Tensor>&, bool)>;

void set_python_op_runner(PythonOpRunner runner);
const PythonOpRunner& python_op_runner();

}  // namespace torch_ort
