// Operators of other libraries (torch.library: transformers, Liger, the user's own) that ATenOp
// may call. ATenOp runs aten:: operators, and beyond them only the operators this process routed
// through the ATen fallback while exporting: a graph read from bytes cannot name any other
// operator of a Python library, or a collective, and have it run.
#pragma once

#include <string>
#include <vector>

namespace torch_ort::kernels {

// Lets ATenOp call `qualified` ("namespace::name.overload"), a registered dispatcher operator.
void allow_library_op(const std::string& qualified);
bool library_op_allowed(const std::string& qualified);
std::vector<std::string> allowed_library_ops();

}  // namespace torch_ort::kernels
