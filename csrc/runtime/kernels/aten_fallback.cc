// com.torch_ort::ATenOp and ATenOpGrad: an ATen operator called through the dispatcher by name,
// with PyTorch autograd as its backward. The attribute encoding is written down in
// torch_ort/ortmodule/export/translations/aten_op.py; the extra training outputs in
// csrc/core/ir/aten_op.h.
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>
#include <ATen/ScalarOps.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/autograd.h>

#include "csrc/core/ir/aten_op.h"
#include "csrc/runtime/dtype.h"
#include "csrc/runtime/kernels/autograd_node.h"
#include "csrc/runtime/kernels/common.h"
#include "csrc/runtime/kernels/library_ops.h"

namespace torch_ort::kernels {

namespace {
std::mutex library_mutex;
std::set<std::string>& library_ops() {
  static std::set<std::string> ops;
  return ops;
}
}  // namespace

void allow_library_op(const std::string& qualified) {
  std::lock_guard<std::mutex> lock(library_mutex);
  library_ops().insert(qualified);
}

bool library_op_allowed(const std::string& qualified) {
  std::lock_guard<std::mutex> lock(library_mutex);
  return library_ops().count(qualified) != 0;
}

std::vector<std::string> allowed_library_ops() {
  std::lock_guard<std::mutex> lock(library_mutex);
  return {library_ops().begin(), library_ops().end()};
}

namespace {

std::string op_name(const KernelCtx& c) { return c.attrs.get_string("aten_op", "?"); }

// "aten::cumsum.default" -> the dispatcher's operator handle ("default" is the empty overload).
c10::OperatorHandle resolve_operator(const KernelCtx& c) {
  const std::string full = op_name(c);
  const size_t ns = full.find("::");
  const size_t dot = full.find('.', ns == std::string::npos ? 0 : ns);
  if (ns == std::string::npos || dot == std::string::npos)
    c.fail("attribute aten_op must read 'namespace::name.overload', got '" + full + "'");
  // aten:: operators, and the other libraries' operators this process routed (library_ops.h):
  // other namespaces hold operators implemented in Python (torch.library) or with side effects
  // (collectives) that no model file may name on its own.
  if ((full.compare(0, ns, "aten") != 0 || ns != 4) && !library_op_allowed(full))
    c.fail("ATenOp runs aten:: operators and the operators of other libraries that this process "
           "routed through the ATen fallback while exporting; the graph names '" + full + "'");
  const std::string name = full.substr(0, dot), overload = full.substr(dot + 1);
  auto op = c10::Dispatcher::singleton().findSchema({name, overload == "default" ? "" : overload});
  if (!op) c.fail("no ATen operator " + full + " in this PyTorch build");
  return *op;
}

// The schema type with Optional[...] peeled off: what a present value must be.
c10::TypePtr base_type(const c10::Argument& arg) {
  c10::TypePtr t = arg.type();
  if (auto opt = t->cast<c10::OptionalType>()) return opt->getElementType();
  return t;
}

c10::Layout parse_layout(const KernelCtx& c, const std::string& s) {
  if (s == "strided") return c10::kStrided;
  if (s == "sparse_coo") return c10::kSparse;
  c.fail(op_name(c) + ": unsupported layout '" + s + "'");
}

c10::MemoryFormat parse_memory_format(const KernelCtx& c, const std::string& s) {
  if (s == "contiguous_format") return c10::MemoryFormat::Contiguous;
  if (s == "preserve_format") return c10::MemoryFormat::Preserve;
  if (s == "channels_last") return c10::MemoryFormat::ChannelsLast;
  if (s == "channels_last_3d") return c10::MemoryFormat::ChannelsLast3d;
  c.fail(op_name(c) + ": unsupported memory format '" + s + "'");
}

// A Python number as the schema wants it: int, float, bool, Scalar (NumberType keeps its kind),
// or a wrapped-number tensor where a Tensor is expected (it promotes like a Python scalar).
c10::IValue number_as(const c10::TypePtr& type, const c10::Scalar& v) {
  switch (type->kind()) {
    case c10::TypeKind::TensorType: {
      at::Tensor t = c10::scalar_to_tensor(v);
      t.unsafeGetTensorImpl()->set_wrapped_number(true);
      return t;
    }
    case c10::TypeKind::FloatType: return v.toDouble();
    case c10::TypeKind::BoolType: return v.toBool();
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType: return v.toLong();
    default: return c10::IValue(v);
  }
}

// Builds the dispatcher stack from inputs and attributes. `tensors[i]` replaces node input i
// (the leaf autograd differentiates against) where defined.
class StackBuilder {
 public:
  StackBuilder(const KernelCtx& c, const std::vector<at::Tensor>& tensors) : c_(c), tensors_(tensors) {}

  torch::jit::Stack build(const c10::FunctionSchema& schema) {
    const std::vector<std::string> kinds = c_.attrs.get_strings("arg_kinds", {});
    if (kinds.size() != schema.arguments().size())
      c_.fail(op_name(c_) + ": " + std::to_string(kinds.size()) + " encoded arguments, but the schema " +
              "has " + std::to_string(schema.arguments().size()) + " (" + toString(schema) + ")");
    torch::jit::Stack stack;
    for (size_t i = 0; i < kinds.size(); ++i) stack.push_back(arg(schema.arguments()[i], i, kinds[i]));
    return stack;
  }

 private:
  const at::Tensor& tensor(int64_t index) const {
    if (index >= 0 && index < static_cast<int64_t>(tensors_.size()) && tensors_[index].defined())
      return tensors_[index];
    return c_.input(static_cast<int>(index));
  }
  // A number read on the host: a declared host input (planner/placement.cc), never a device wait.
  c10::Scalar item(int64_t index) const { return c_.input_item(static_cast<int>(index)); }

  c10::IValue arg(const c10::Argument& a, size_t i, const std::string& kind) const {
    const std::string name = "arg" + std::to_string(i);
    const c10::TypePtr type = base_type(a);
    if (kind == "default") {
      if (!a.default_value()) c_.fail(op_name(c_) + ": argument '" + a.name() + "' has no default");
      return *a.default_value();
    }
    if (kind == "none") return c10::IValue();
    if (kind == "tensor") return tensor(c_.attrs.get_int(name, -1));
    if (kind == "tensors") {
      const std::vector<int64_t> idx = c_.attrs.get_ints(name, {});
      const auto list = type->cast<c10::ListType>();
      if (list && list->getElementType()->cast<c10::OptionalType>()) {
        c10::List<std::optional<at::Tensor>> out;
        for (int64_t k : idx) out.push_back(k < 0 ? std::nullopt : std::optional<at::Tensor>(tensor(k)));
        return out;
      }
      c10::List<at::Tensor> out;
      for (int64_t k : idx) out.push_back(tensor(k));
      return out;
    }
    if (kind == "int") return number_as(type, c10::Scalar(c_.attrs.get_int(name, 0)));
    if (kind == "bool") return number_as(type, c10::Scalar(c_.attrs.get_int(name, 0) != 0));
    if (kind == "item") return number_as(type, item(c_.attrs.get_int(name, -1)));
    if (kind == "float" || kind == "floats") {
      const TensorData* t = c_.attrs.get_tensor(name);
      if (!t) c_.fail(op_name(c_) + ": argument '" + a.name() + "' has no value attribute " + name);
      const std::vector<double> v = t->as_doubles();
      if (kind == "floats") return v;
      return number_as(type, c10::Scalar(v.at(0)));
    }
    if (kind == "ints") {
      std::vector<int64_t> v = c_.attrs.get_ints(name, {});
      const std::vector<int64_t> from = c_.attrs.get_ints(name + "_inputs", {});
      for (size_t k = 0; k < from.size() && k < v.size(); ++k)
        if (from[k] >= 0) v[k] = item(from[k]).toLong();  // a size traced from a shape
      return v;
    }
    if (kind == "bools") {
      c10::List<bool> out;
      for (int64_t b : c_.attrs.get_ints(name, {})) out.push_back(b != 0);
      return out;
    }
    if (kind == "str") return c_.attrs.get_string(name, "");
    if (kind == "dtype") {
      const auto d = static_cast<DType>(c_.attrs.get_int(name, 0));
      return static_cast<int64_t>(to_aten(d, op_name(c_) + " argument '" + a.name() + "'"));
    }
    if (kind == "layout") return static_cast<int64_t>(parse_layout(c_, c_.attrs.get_string(name, "")));
    if (kind == "memory_format")
      return static_cast<int64_t>(parse_memory_format(c_, c_.attrs.get_string(name, "")));
    if (kind == "device") {  // exported as "cuda:0": the run's own index where the type matches
      const c10::Device d(c_.attrs.get_string(name, "cpu"));
      return d.type() == c_.device.type() ? c_.device : d;
    }
    c_.fail(op_name(c_) + ": argument '" + a.name() + "' has unknown kind '" + kind + "'");
  }

  const KernelCtx& c_;
  const std::vector<at::Tensor>& tensors_;
};

}  // namespace

void run_recording_autograd(KernelCtx& c, const std::string& what, const AutogradCallee& callee) {
  const int n = static_cast<int>(c.attrs.get_int("num_results", c.num_outputs()));
  std::vector<at::Tensor> args(c.num_inputs());
  bool record = false;
  for (int i = 0; i < c.num_inputs(); ++i) {
    if (c.output_wanted(2 * n + i)) {
      args[i] = c.input(i).detach().requires_grad_(true);
      record = true;
    }
  }
  for (int i = 0; i < c.num_inputs(); ++i)
    if (!args[i].defined() && c.has_input(i)) args[i] = c.input(i);
  std::vector<at::Tensor> results;
  {
    at::AutoGradMode grad_mode(record);  // the engine runs forward under no_grad
    results = callee(args, record);
  }
  for (const at::Tensor& t : results)
    if (t.defined() && t.is_complex())  // the exporter types complex results as real pairs
      c.fail(what + " returned a complex tensor; complex values are not supported");
  if (static_cast<int>(results.size()) != n)
    c.fail(what + " returned " + std::to_string(results.size()) + " tensors; the node has " +
           std::to_string(n) + " results");
  for (int k = 0; k < n; ++k) {
    if (!record) {
      c.set_output(k, results[k]);
      continue;
    }
    c.set_output(k, results[k].detach());
    c.set_output(n + k, results[k]);
  }
  for (int i = 0; i < c.num_inputs(); ++i)
    if (c.output_wanted(2 * n + i)) c.set_output(2 * n + i, args[i]);
}

namespace {

// Runs the op through the dispatcher (see run_recording_autograd for the outputs).
void aten_op_kernel(KernelCtx& c) {
  const c10::OperatorHandle op = resolve_operator(c);
  run_recording_autograd(c, op_name(c), [&](const std::vector<at::Tensor>& args, bool) {
    torch::jit::Stack stack = StackBuilder(c, args).build(op.schema());
    op.callBoxed(&stack);
    std::vector<at::Tensor> results;
    for (const c10::IValue& v : stack) {
      if (v.isTensor()) results.push_back(v.toTensor());
      else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorVector()) results.push_back(t);
      else c.fail(op_name(c) + " returned a " + v.tagKind() + ", not a tensor");
    }
    return results;
  });
}

// ATenOpGrad(dY_0..dY_{n-1}, Y_0..Y_{n-1} with history, leaves...) -> d leaf, in order.
// A result nobody differentiates (no dY, or not requiring grad: indices) is left out; a leaf
// autograd does not reach (or a Function's backward returns None for) gets zeros where graph
// nodes read its gradient, and stays None where it goes straight to the caller. Leaves that
// other code closes over (a checkpointed block's parameters) accumulate into .grad as in eager.
void aten_op_grad_kernel(KernelCtx& c) {
  const int n = static_cast<int>(c.attrs.get_int("num_results", -1));
  if (n < 0 || c.num_inputs() < 2 * n) c.fail("bad num_results " + std::to_string(n));
  std::vector<at::Tensor> ys, dys, leaves;
  for (int k = 0; k < n; ++k) {
    if (!c.has_input(k) || !c.has_input(n + k)) continue;
    const at::Tensor& y = c.input(n + k);
    if (!y.requires_grad()) continue;
    ys.push_back(y);
    dys.push_back(c.input(k));
  }
  for (int j = 2 * n; j < c.num_inputs(); ++j) leaves.push_back(c.input(j));
  // backward(), not grad(): torch's reentrant checkpoint (a PythonOp) refuses to run under
  // grad(); the leaves are this forward's own, so their .grad is exactly d leaf.
  if (!ys.empty())
    torch::autograd::backward(ys, dys, /*retain_graph=*/false, /*create_graph=*/false);
  for (size_t j = 0; j < leaves.size(); ++j) {
    const at::Tensor g = leaves[j].grad();
    const int out = static_cast<int>(j);
    if (g.defined()) c.set_output(out, g);
    else if (!c.output_may_be_none(out)) c.set_output(out, at::zeros_like(leaves[j]));
    // else: None, as autograd says, straight to the caller (param.grad stays None as in eager)
  }
}

}  // namespace

REGISTER_KERNEL_IN(kOurDomain, kAtenOp, aten_op_kernel);
REGISTER_KERNEL_IN(kOurDomain, kAtenOpGrad, aten_op_grad_kernel);

}  // namespace torch_ort::kernels
