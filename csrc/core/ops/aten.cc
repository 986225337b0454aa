// Ops that run PyTorch code (autodiff/aten_op.h): never merged, their outputs view their results
// and inputs. Their host inputs depend on each node's arguments (placement.cc reads them).
#include "csrc/core/ops/families.h"

namespace torch_ort::ops {

std::vector<OpEntry> aten_ops() {
  using enum ViewRule;
  return {
      {kOurDomain, "ATenOp", {.opaque = true, .view = kAutogradOp}},
      // Consumes the autograd history its ATenOp/PythonOp recorded, once.
      {kOurDomain, "ATenOpGrad", {.opaque = true}},
      {kOurDomain, "PythonOp", {.opaque = true, .view = kAutogradOp}},
      // torch.onnx's ATen fallback (operator_export_type ONNX_ATEN_FALLBACK).
      {"org.pytorch.aten", "ATen", {.opaque = true}},
  };
}

}  // namespace torch_ort::ops
