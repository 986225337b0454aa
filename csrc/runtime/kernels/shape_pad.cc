// Pad(X, pads, [constant_value], [axes]) in ONNX's four modes: constant (at::constant_pad_nd,
// negative pads crop), and reflect / edge / wrap (at::pad's reflect / replicate / circular, which
// pad only the innermost one to three dims). Before opset 11, 'pads' is an attribute (and a float
// 'value' attribute, which the importer refuses: 'value' is a tensor attribute in the core).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/pad.h>

#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

void pad_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const int64_t rank = x.dim();
  const bool inputs = c.opset >= 11 || c.has_input(1);
  const std::vector<int64_t> pads = inputs ? c.input_ints(1) : c.attrs.get_ints("pads", {});
  const c10::Scalar value = inputs && c.has_input(2) ? c.input_item(2) : c10::Scalar(0);
  std::vector<int64_t> axes;
  if (c.has_input(3)) {
    axes = norm_axes(c, c.input_ints(3), rank);
  } else {
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  }
  if (pads.size() != 2 * axes.size())
    c.fail("pads " + c10::str(c10::IntArrayRef(pads)) + " must hold a begin and an end for each of the " +
           std::to_string(axes.size()) + " padded axes");
  std::vector<int64_t> begin(rank, 0), end(rank, 0);
  for (size_t k = 0; k < axes.size(); ++k) {
    begin[axes[k]] = pads[k];
    end[axes[k]] = pads[k + axes.size()];
  }
  // ATen's pad list: (begin, end) of the last dim first, up to the outermost padded dim.
  int64_t outer = rank;
  for (int64_t d = 0; d < rank && outer == rank; ++d)
    if (begin[d] || end[d]) outer = d;
  std::vector<int64_t> aten;
  for (int64_t d = rank - 1; d >= outer; --d) {
    aten.push_back(begin[d]);
    aten.push_back(end[d]);
  }
  const std::string mode = c.attrs.get_string("mode", "constant");
  if (mode == "constant") return c.set_output(0, at::constant_pad_nd(x, aten, value));
  const char* aten_mode = mode == "reflect" ? "reflect" : mode == "edge" ? "replicate" : mode == "wrap" ? "circular" : nullptr;
  if (!aten_mode) c.fail("mode '" + mode + "' is not one of constant, reflect, edge, wrap");
  const int64_t padded = rank - outer;
  if (aten.empty()) return c.set_output(0, x);
  // at::pad's non-constant modes pad the last 1-3 dims of an input with 1-2 more dims before them.
  if (padded > 3 || rank < padded + 1 || rank > padded + 2)
    c.fail("mode '" + mode + "' pads only the innermost 1 to 3 dims of an input with 1 or 2 more dims "
           "(input of rank " + std::to_string(rank) + " padded on its last " + std::to_string(padded) + ")");
  for (int64_t p : aten)
    if (p < 0) c.fail("mode '" + mode + "' takes no negative pads, got " + c10::str(c10::IntArrayRef(pads)));
  c.set_output(0, at::pad(x, aten, aten_mode));
}

}  // namespace

REGISTER_KERNEL("Pad", pad_kernel);

}  // namespace torch_ort::kernels
