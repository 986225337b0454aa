// The aten family: ops that run PyTorch code (ir/aten_op.h): our ATenOp and PythonOp,
// ATenOpGrad, and torch.onnx's ATen fallback. Never merged; their outputs view their results and
// inputs; their host inputs depend on each node's arguments (placement.cc reads them). Kernels:
// csrc/runtime/kernels/aten_*.cc.
// One home per op: its traits line (aten_ops() below), its shape rule (shapes/shape_rules.h) and
// its gradient rule or the reason it has none (autodiff/gradient_registry.h) are all here.
//
// The gradient of ATenOp and PythonOp is one ATenOpGrad node that hands the forward's autograd
// state to torch.autograd.backward (see aten_op.h for the outputs it reads).
#include <string>
#include <vector>

#include "csrc/core/ir/aten_op.h"
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/graph.h"
#include "csrc/core/ops/families.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort::ops {
namespace {

// The arguments ATenOp's stack builder reads as numbers: kind "item" (arg<i> names the input) and
// the sizes of kind "ints" traced from shapes (arg<i>_inputs, -1 where a size is fixed).
void numeric_arguments(const Node& n, std::vector<int>& out) {
  const std::vector<std::string> kinds = n.attrs.get_strings("arg_kinds", {});
  for (size_t i = 0; i < kinds.size(); ++i) {
    const std::string name = "arg" + std::to_string(i);
    if (kinds[i] == "item") out.push_back(static_cast<int>(n.attrs.get_int(name, -1)));
    if (kinds[i] == "ints")
      for (int64_t k : n.attrs.get_ints(name + "_inputs", {})) out.push_back(static_cast<int>(k));
  }
}

}  // namespace

std::vector<OpEntry> aten_ops() {
  using enum ViewRule;
  return {
      // Any arguments, any results.
      {kOurDomain, "ATenOp", {.opaque = true, .view = kAutogradOp, .arity = OpArity{0, kVariadic, 0, kVariadic},
                              .more_host_inputs = numeric_arguments}},
      // Consumes the autograd history its ATenOp/PythonOp recorded, once. Reads (dY_k.., Y_k..,
      // leaf_i..), each may be absent, and yields one gradient per needed input.
      {kOurDomain, "ATenOpGrad",
       {.opaque = true, .arity = OpArity{0, kVariadic, 1, kVariadic}, .more_host_inputs = numeric_arguments}},
      {kOurDomain, "PythonOp", {.opaque = true, .view = kAutogradOp, .arity = OpArity{0, kVariadic, 0, kVariadic}}},
      // torch.onnx's ATen fallback (operator_export_type ONNX_ATEN_FALLBACK).
      {"org.pytorch.aten", "ATen", {.opaque = true}},
  };
}

}  // namespace torch_ort::ops

namespace torch_ort {

void request_aten_autograd_outputs(Graph& g, Node& n) {
  if (n.attrs.has("num_results")) return;
  const int64_t num_results = static_cast<int64_t>(n.outputs.size());
  n.attrs.set("num_results", num_results);
  for (int64_t k = 0; k < num_results; ++k) {
    const ValueId y = n.outputs[k];
    if (y == kNoValue)
      throw GradientError(n.describe() + ": output " + std::to_string(k) + " is omitted; ATenOp "
                          "results must all be present");
    const Value info = g.value(y);  // a copy: new_value may grow the value table
    n.outputs.push_back(g.new_value(info.name + "/autograd", info.dtype, info.shape));
  }
  for (ValueId x : n.inputs) {
    if (x == kNoValue || !is_floating(g.value(x).dtype)) {
      n.outputs.push_back(kNoValue);  // never requires grad: no leaf
      continue;
    }
    const Value info = g.value(x);
    n.outputs.push_back(g.new_value(info.name + "/leaf", info.dtype, info.shape));
  }
}

namespace {

// --- shape rules (shapes/shape_rules.h)


// An ATen operator carried by name: the core knows nothing of its semantics, so its results keep
// the shapes the exporter recorded (or stay unknown); never an error.
void opaque_aten_op(ShapeCtx&) {}

// --- gradient rules (autodiff/gradient_registry.h)

// dX_i = dY · ∂Y_attached/∂X_leaf_i as PyTorch autograd computes it (the op's own derivative).
// ATenOpGrad(dY_0..dY_{n-1}, Y_attached_0..Y_attached_{n-1}, X_leaf for each needed input)
//   -> one gradient per needed input, in input order. Where no dY_k flows, dY_k and Y_k are
//   omitted inputs.
void aten_op_grad(GradCtx& g) {
  const int64_t n = g.attrs().get_int("num_results", -1);
  if (n < 0)
    throw GradientError(g.node().describe() + ": its autograd outputs were never requested");
  std::vector<ValueId> ins;
  for (int64_t k = 0; k < n; ++k) ins.push_back(g.grad_out(static_cast<int>(k)));
  for (int64_t k = 0; k < n; ++k)  // a result no gradient reaches is not kept for backward
    ins.push_back(g.has_grad_out(static_cast<int>(k)) ? g.out(static_cast<int>(n + k)) : kNoValue);
  std::vector<int> wrt;
  std::vector<ValueId> likes;
  for (int i = 0; i < static_cast<int>(g.node().inputs.size()); ++i) {
    if (!g.needs(i)) continue;
    ins.push_back(g.out(static_cast<int>(2 * n) + i));
    wrt.push_back(i);
    likes.push_back(g.in(i));
  }
  Attributes a;
  a.set("aten_op", g.attrs().get_string("aten_op", g.attrs().get_string("name", "")));  // for errors
  a.set("num_results", n);
  const std::vector<ValueId> grads = g.ours_multi(kAtenOpGrad, std::move(ins), likes, std::move(a));
  for (size_t j = 0; j < wrt.size(); ++j) g.set_grad(wrt[j], grads[j]);
}

}  // namespace

// ATenOpGrad's outputs are declared like its inputs.
REGISTER_SHAPE_RULE_IN(kOurDomain, "ATenOp", opaque_aten_op);
REGISTER_SHAPE_RULE_IN(kOurDomain, "PythonOp", opaque_aten_op);  // shapes from the Function's probe run
REGISTER_SHAPE_RULE_IN(kOurDomain, "ATenOpGrad", declared_by_gradient_builder);

REGISTER_GRADIENT_IN(kOurDomain, kAtenOp, aten_op_grad, {});
// A torch.autograd.Function: autograd's backward over its recorded results runs its own backward.
REGISTER_GRADIENT_IN(kOurDomain, kPythonOp, aten_op_grad, {});

}  // namespace torch_ort
