// Padding elimination's kernels (core: passes/padding_elimination.cc, ops/index.cc): the rows
// that count, the moves between (B, T, ...) and the packed (K, ...) layout, and the check that
// the attention mask keeps every counted row away from the dropped ones.
#include <cmath>
#include <string>

#include <ATen/core/Tensor.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/any.h>
#include <ATen/ops/full.h>
#include <ATen/ops/where.h>
#include <ATen/ops/gt.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/zeros.h>

#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

std::string rows_sizes_text(const at::Tensor& t) { return c10::str(t.sizes()); }

// PaddingRows(mask, ids[, labels]; ignore_index) -> the flat positions b·T + t whose mask is not
// 0, or whose label counts, in order. How many is data: the host waits for it (a counted read).
void padding_rows_kernel(KernelCtx& c) {
  const at::Tensor& mask = c.input(0);
  const at::Tensor& ids = c.input(1);
  if (mask.dim() != 2 || !mask.sizes().equals(ids.sizes()))
    c.fail("padding elimination: the attention mask must be (batch, sequence) like the input ids " +
           rows_sizes_text(ids) + ", got " + rows_sizes_text(mask));
  at::Tensor keep = mask.reshape({-1}).ne(0);
  if (c.has_input(2)) {
    const at::Tensor& labels = c.input(2);
    if (labels.numel() != ids.numel())
      c.fail("padding elimination: the loss's labels " + rows_sizes_text(labels) + " are not one per input id " +
             rows_sizes_text(ids));
    keep = at::logical_or(keep, labels.reshape({-1}).ne(c.attrs.get_int("ignore_index", -100)));
  }
  HostReadScope::add();
  at::Tensor rows = at::nonzero(keep).view({-1});
  LabelCountScope::add_rows(rows.size(0), keep.numel());
  c.set_output(0, std::move(rows));
}

// PackRows(X (B, T, ...), rows) -> X's rows b·T + t, (K, ...).
void pack_rows_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  if (x.dim() < 2) c.fail("expects (batch, sequence, ...), got " + rows_sizes_text(x));
  c.set_output(0, at::index_select(x.flatten(0, 1), 0, c.input(1)));
}

// PadRows(X (K, ...), rows, shape) -> zeros (shape[0], shape[1], ...) with X's rows put back.
void pad_rows_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& rows = c.input(1);
  const std::vector<int64_t> shape = c.input_ints(2);
  if (shape.size() < 2 || x.dim() < 1 || x.size(0) != rows.numel())
    c.fail("expects (rows, ...) with one row per position, got " + rows_sizes_text(x) + " for " +
           std::to_string(rows.numel()) + " positions");
  std::vector<int64_t> flat(x.sizes().begin(), x.sizes().end()), out(flat);
  flat[0] = shape[0] * shape[1];
  out.erase(out.begin());
  out.insert(out.begin(), {shape[0], shape[1]});
  at::Tensor y = at::zeros(flat, x.options());
  y.index_copy_(0, rows, x);
  c.set_output(0, y.view(out));
}

// PaddingMaskCheck(mask, rows, ids) -> mask. Exact only when every counted query row gives the
// dropped keys weight 0: a boolean mask false for them, an additive one whose largest value over
// dropped keys is -inf or at least 1e4 below its largest over counted keys (its exp is then 0
// beside theirs; scores are far smaller). A counted row that may attend no counted key fails too: softmax would spread its
// weight over every key, dropped ones included.
void padding_mask_check_kernel(KernelCtx& c) {
  const at::Tensor& mask = c.input(0);
  const at::Tensor& ids = c.input(2);
  const int64_t b = ids.size(0), t = ids.size(1);
  const auto fits = [&](int64_t d, int64_t want) { return mask.size(d) == want || mask.size(d) == 1; };
  if (mask.dim() < 2 || mask.dim() > 4 || mask.size(-1) != t || !fits(-2, t) || (mask.dim() == 4 && !fits(0, b)))
    c.fail("padding elimination: the attention mask " + rows_sizes_text(mask) + " is not (batch, heads, " +
           std::to_string(t) + " or 1, " + std::to_string(t) + ")");
  at::Tensor m = mask.scalar_type() == at::kBool
                     ? at::where(mask, at::zeros({}, mask.options().dtype(at::kFloat)),
                                 at::full({}, -INFINITY, mask.options().dtype(at::kFloat)))
                     : mask.to(at::kFloat);
  while (m.dim() < 4) m = m.unsqueeze(0);
  at::Tensor counted = at::zeros({b * t}, ids.options().dtype(at::kBool));
  counted.index_fill_(0, c.input(1), true);
  counted = counted.view({b, 1, 1, t});  // as keys
  const at::Tensor none = at::full({}, -INFINITY, m.options());
  const at::Tensor over_counted = at::where(counted, m, none).amax(-1);              // (B, H, T or 1)
  const at::Tensor over_dropped = at::where(at::logical_not(counted), m, none).amax(-1);
  const at::Tensor query = counted.view({b, 1, t});
  // As a difference: finfo.min - 1e4 rounds back to finfo.min, and a row all finfo.min is uniform.
  const at::Tensor apart = at::sub(over_counted, over_dropped).ge(1e4);
  at::Tensor leak = at::logical_and(at::logical_and(over_dropped.gt(-INFINITY), at::logical_not(apart)),
                                    over_counted.size(-1) == 1 ? query.any(-1, true) : query);
  HostReadScope::add();
  if (leak.any().item<bool>())
    c.fail("padding elimination (ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER=1): the attention mask lets a "
           "position that counts attend a position whose attention_mask is 0, so dropping the padding would "
           "change the result; this model needs the variable unset");
  c.set_output(0, mask);
}

}  // namespace

REGISTER_KERNEL_IN(kOurDomain, "PaddingRows", padding_rows_kernel);
REGISTER_KERNEL_IN(kOurDomain, "PackRows", pack_rows_kernel);
REGISTER_KERNEL_IN(kOurDomain, "PadRows", pad_rows_kernel);
REGISTER_KERNEL_IN(kOurDomain, "PaddingMaskCheck", padding_mask_check_kernel);

}  // namespace torch_ort::kernels
