// LinearCrossEntropy (ours, passes/linear_cross_entropy_fusion.cc): the LM head X·W (+ bias) and
// its cross-entropy in chunks of rows, never more than one chunk × V of logits at a time.
//
//   (X (N, H), W (H, V) or (V, H) with transB, [bias (V)], labels (N), [Full], [rows])
//     -> (loss, [dX], [dW], [dbias])
//
// Per chunk: its logits (one GEMM, or the chunk's rows copied out of Full, the product already
// computed for a returned output, picked by `rows` or in order), then per row the loss and the
// gradient softmax − onehot written over the logits (cpu/cross_entropy_rows.h on AVX-512, else the
// same formulas as ATen ops), then dX's rows = G·Wᵀ and dW += Xᵀ·G (bias: += Σ rows of G). The
// gradients are the loss's own (d loss = 1): the gradient rule scales them by the incoming
// gradient, so backward runs no GEMM over the vocabulary and forward keeps no logits for it.
// Logits of a lower precision are rounded to it by their GEMM and read as float, as eager's
// logits.float(); the gradient reaches the GEMMs rounded to that dtype, as eager's. Gemma's
// soft-capping (`softcap` c: c·tanh(l / c)) is applied to each chunk, and its derivative to the
// chunk's gradient.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_assert_async.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include "csrc/runtime/buffer_pool.h"
#include "csrc/runtime/kernels/common.h"
#include "csrc/runtime/kernels/cpu/cross_entropy_rows.h"
#include "csrc/runtime/kernels/decimal.h"

namespace torch_ort::kernels {
namespace {

constexpr int64_t kDefaultChunkBytes = int64_t{256} << 20;  // the fusion pass sets its own

struct Args {
  at::Tensor x, wt, bias, labels, full, rows;  // wt: (H, V) (a transposed view under transB)
  bool trans_b = false;
  double alpha = 1.0;
  bool mean = true;
  bool has_ignore = false;
  int64_t ignore_index = 0;
  double eps = 0.0;
  int64_t chunk_rows = 0;
  double softcap = 0;  // the logits are c·tanh(X·W / c) (Gemma); Full holds them capped
};

Args read_args(const KernelCtx& c) {
  Args a;
  a.x = c.input(0);
  const at::Tensor& w = c.input(1);
  a.trans_b = c.attrs.get_int("transB", 0) != 0;
  if (a.x.dim() != 2 || w.dim() != 2)
    c.fail("X must be (rows, hidden) and W 2-D, got " + c10::str(a.x.sizes()) + " and " + c10::str(w.sizes()));
  a.wt = a.trans_b ? w.t() : w;
  if (a.wt.size(0) != a.x.size(1))
    c.fail("X " + c10::str(a.x.sizes()) + " and W " + c10::str(w.sizes()) + (a.trans_b ? " (transB)" : "") +
           " do not multiply");
  if (w.scalar_type() != a.x.scalar_type())
    c.fail("X and W differ in dtype: " + std::string(c10::toString(a.x.scalar_type())) + " and " +
           std::string(c10::toString(w.scalar_type())));
  const int64_t n = a.x.size(0), v = a.wt.size(1);
  if (c.has_input(2)) {
    a.bias = c.input(2);
    if (a.bias.numel() != v || a.bias.scalar_type() != a.x.scalar_type())
      c.fail("bias must hold " + std::to_string(v) + " values of X's dtype, got " + c10::str(a.bias.sizes()));
    a.bias = a.bias.reshape({v});
  }
  a.labels = c.input(3);
  if (a.labels.dim() != 1 || a.labels.size(0) != n)
    c.fail("labels must be (" + std::to_string(n) + "), one per row of X, got " + c10::str(a.labels.sizes()));
  if (a.labels.scalar_type() != at::kLong) a.labels = a.labels.to(at::kLong);
  if (c.has_input(4)) {
    a.full = c.input(4);
    if (a.full.dim() < 2 || a.full.size(-1) != v)
      c.fail("the computed product must end in the " + std::to_string(v) + " classes, got " +
             c10::str(a.full.sizes()));
    a.full = a.full.reshape({-1, v});
    if (c.has_input(5)) {
      a.rows = c.input(5);
      if (a.rows.dim() != 1 || a.rows.size(0) != n)
        c.fail("rows must pick one row of the product per row of X, got " + c10::str(a.rows.sizes()));
    } else if (a.full.size(0) != n) {
      c.fail("the computed product has " + std::to_string(a.full.size(0)) + " rows, X " + std::to_string(n));
    }
  }
  a.alpha = c.attrs.get_float("alpha", 1.0f);
  const std::string r = c.attrs.get_string("reduction", "mean");
  if (r != "mean" && r != "sum") c.fail("reduction must be 'mean' or 'sum', got '" + r + "'");
  a.mean = r == "mean";
  a.has_ignore = c.attrs.has("ignore_index");
  a.ignore_index = c.attrs.get_int("ignore_index", 0);
  a.eps = shortest_decimal(c.attrs.get_float("label_smoothing", 0.0f));
  if (!(a.eps >= 0.0 && a.eps <= 1.0)) c.fail("label_smoothing must be in [0, 1], got " + std::to_string(a.eps));
  a.softcap = c.attrs.get_float("softcap", 0.0f);
  if (!(a.softcap >= 0.0)) c.fail("softcap must be positive (0: none), got " + std::to_string(a.softcap));
  const int64_t bytes = c.attrs.get_int("chunk_bytes", kDefaultChunkBytes);
  a.chunk_rows = std::max<int64_t>(1, bytes / std::max<int64_t>(1, v * 4));
  return a;
}

// The counted labels (not ignored), and an error naming the first one outside [0, V). On a
// device the check is an asynchronous assert, as eager's loss kernels make it: no host wait.
at::Tensor counted(const KernelCtx& c, const Args& a, int64_t v) {
  at::Tensor valid = a.has_ignore ? at::ne(a.labels, a.ignore_index) : at::ones_like(a.labels, at::kBool);
  const at::Tensor out_of_range = at::logical_and(valid, at::logical_or(a.labels.lt(0), a.labels.ge(v)));
  if (!a.labels.is_cpu()) {
    at::_assert_async(out_of_range.any().logical_not(),
                      "LinearCrossEntropy: a label is outside the " + std::to_string(v) + " classes");
    return valid;
  }
  if (out_of_range.any().item<bool>()) {
    const int64_t at_row = out_of_range.nonzero().select(1, 0)[0].item<int64_t>();
    c.fail("label " + std::to_string(a.labels[at_row].item<int64_t>()) + " at row " + std::to_string(at_row) +
           " is outside the " + std::to_string(v) + " classes [0, " + std::to_string(v) + ")" +
           (a.has_ignore ? " and is not the ignore_index " + std::to_string(a.ignore_index) : ""));
  }
  return valid;
}

// The chunk's logits, written into `buf` (rows × V, ours: the gradient is written over it). One
// buffer serves every chunk: a fresh vocabulary-wide allocation per chunk costs its page faults.
at::Tensor chunk_logits(const Args& a, int64_t r0, int64_t rows, at::Tensor& buf) {
  at::Tensor out = buf.narrow(0, 0, rows);
  if (a.full.defined()) {
    if (a.rows.defined()) return at::index_select_out(out, a.full, 0, a.rows.narrow(0, r0, rows));
    return out.copy_(a.full.narrow(0, r0, rows));
  }
  const at::Tensor xc = a.x.narrow(0, r0, rows);
  if (a.bias.defined()) return at::addmm_out(out, a.bias, xc, a.wt, 1.0, a.alpha);
  at::mm_out(out, xc, a.wt);
  if (a.alpha != 1.0) out.mul_(a.alpha);
  return out;
}

// The rows' losses (float, 0 where ignored) and, with `grad`, the gradient over `logits`, as
// ATen ops: any device, any float dtype. scale: a 0-dim float tensor (1/count for a mean).
// `logits` is the kernel's own chunk: the softmax is made in place over it (over its float copy
// for another dtype), so the path holds no chunk-sized buffer beyond that copy
// (compile.cc's kernel_workspace charges what this holds).
at::Tensor rows_by_aten(at::Tensor& logits, const at::Tensor& labels, const at::Tensor& valid, const Args& a,
                        const at::Tensor& scale, bool grad) {
  const int64_t v = logits.size(1);
  at::Tensor lf = logits.to(at::kFloat);  // logits itself when float
  const at::Tensor safe = at::where(valid, labels, at::zeros_like(labels)).unsqueeze(1);
  // What the loss reads of the logits, before they are overwritten.
  at::Tensor loss = lf.gather(1, safe).squeeze(1).mul(-(1.0 - a.eps));
  if (a.eps > 0) loss.sub_(lf.sum(1), a.eps / v);
  // logsumexp = m + log Σ exp(l − m), with exp(l − m) written over the logits.
  at::Tensor m = std::get<0>(lf.max(1, true));
  m.masked_fill_(m.isinf(), 0.0);  // a row of −inf (or +inf) reads as ATen's logsumexp does
  const at::Tensor sum = lf.sub_(m).exp_().sum(1, true);
  loss.add_(m.add(sum.log()).squeeze(1));
  loss = at::where(valid, loss, at::zeros_like(loss));
  if (grad) {
    lf.div_(sum);  // the softmax
    if (a.eps > 0) lf.sub_(a.eps / v);
    lf.scatter_add_(1, safe, at::full_like(safe, -(1.0 - a.eps), lf.options()));
    // masked, not multiplied by 0: with no counted label the mean's scale is inf (eager's
    // gradient is still 0 at ignored rows)
    lf.mul_(scale).masked_fill_(valid.logical_not().unsqueeze(1), 0.0);
    logits.copy_(lf);  // none when float: lf is logits, and copy_ returns at once
  }
  return loss;
}

void linear_cross_entropy_kernel(KernelCtx& c) {
  const Args a = read_args(c);
  const int64_t n = a.x.size(0), h = a.x.size(1), v = a.wt.size(1);
  const bool want_dx = c.output_wanted(1), want_dw = c.output_wanted(2), want_db = c.output_wanted(3) && a.bias.defined();
  const bool grad = want_dx || want_dw || want_db;
  const at::Tensor valid = counted(c, a, v);
  const bool cpu = a.x.is_cpu();
  // The mean's denominator: a host number on the CPU, a device scalar elsewhere (no host wait).
  const at::Tensor count = valid.sum().to(at::kFloat);
  const at::Tensor scale = a.mean ? at::reciprocal(count) : at::ones({}, count.options());
  const float host_scale = cpu ? scale.item<float>() : 0.0f;
  const auto f32 = a.x.options().dtype(at::kFloat);
  at::Tensor dx = want_dx ? at::empty({n, h}, a.x.options()) : at::Tensor();
  // dW and dbias add up over the chunks in float, whatever the weight's dtype. dW's first chunk
  // writes it (no zero fill of a vocabulary-sized buffer), unless there is no row at all.
  // Both vocabulary-sized buffers come from the pool (buffer_pool.h): a step reuses the last one's.
  BufferPool& pool = BufferPool::process();
  at::Tensor dw = want_dw ? pool.empty({a.trans_b ? v : h, a.trans_b ? h : v},
                                       a.x.scalar_type() == at::kFloat ? a.x.options() : f32)
                          : at::Tensor();
  if (want_dw && n == 0) dw.zero_();
  at::Tensor db = want_db ? at::zeros({v}, f32) : at::Tensor();
  at::Tensor loss_sum = at::zeros({}, cpu ? f32.dtype(at::kDouble) : f32);
  std::vector<double> row_loss;
  // Chunks of equal size (the last is not a sliver), in one buffer.
  const int64_t chunks = (n + a.chunk_rows - 1) / a.chunk_rows;
  const int64_t chunk_rows = chunks > 0 ? (n + chunks - 1) / chunks : 0;
  const at::Tensor& like = a.full.defined() ? a.full : a.x;
  at::Tensor buf = pool.empty({chunk_rows, v}, like.options());
  for (int64_t r0 = 0; r0 < n; r0 += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, n - r0);
    at::Tensor logits = chunk_logits(a, r0, rows, buf);
    // Soft-capping: the capped logits z = c·tanh(l / c), op by op in the logits' dtype as eager
    // rounds them (a returned Full holds z already), and tanh in float for the gradient.
    at::Tensor tanh;
    if (a.softcap > 0) {
      if (a.full.defined()) {
        tanh = logits.to(at::kFloat).div(a.softcap);  // out of place: Full's rows may be float
      } else {
        const at::Tensor t = logits.div(a.softcap).tanh_();
        logits = t.mul(a.softcap);
        tanh = t.to(at::kFloat);
      }
    }
    const at::Tensor labels = a.labels.narrow(0, r0, rows);
    bool done = false;
    if (cpu) {
      row_loss.assign(static_cast<size_t>(rows), 0.0);
      const cpu::CrossEntropyRows args{labels.contiguous().data_ptr<int64_t>(), a.ignore_index, a.has_ignore,
                                       a.eps, grad ? host_scale : 0.0f};
      done = cpu::cross_entropy_rows(logits, args, row_loss.data());
      if (done) {
        double s = 0;
        for (double l : row_loss) s += l;
        loss_sum += s;
      }
    }
    if (!done) loss_sum += rows_by_aten(logits, labels, valid.narrow(0, r0, rows), a, scale, grad).sum();
    if (!grad) continue;
    if (tanh.defined())  // dl = dz · (1 − tanh²)
      logits.copy_(logits.to(at::kFloat).mul_(tanh.mul_(tanh).neg_().add_(1.0)));
    const at::Tensor xc = a.x.narrow(0, r0, rows);
    if (want_dx) {
      at::Tensor out = dx.narrow(0, r0, rows);
      at::mm_out(out, logits, a.wt.t());
      if (a.alpha != 1.0) out.mul_(a.alpha);
    }
    if (want_dw) {
      const at::Tensor lhs = a.trans_b ? logits.t() : xc.t(), rhs = a.trans_b ? xc : logits;
      const bool first = r0 == 0;  // beta 0: BLAS ignores what the buffer held
      if (dw.scalar_type() == logits.scalar_type()) dw.addmm_(lhs, rhs, first ? 0.0 : 1.0, a.alpha);
      else if (first) dw.copy_(at::mm(lhs, rhs)).mul_(a.alpha);
      else dw.add_(at::mm(lhs, rhs), a.alpha);
    }
    if (want_db) db.add_(logits.sum(0, false, at::kFloat));
  }
  at::Tensor loss = loss_sum.to(at::kFloat);
  if (a.mean) loss = loss.div(count);  // no counted label: 0/0, NaN as eager
  c.set_output(0, loss);
  if (want_dx) c.set_output(1, dx);
  if (want_dw) c.set_output(2, dw.scalar_type() == a.x.scalar_type() ? dw : dw.to(a.x.scalar_type()));
  if (want_db) c.set_output(3, db.to(a.bias.scalar_type()));
}

// LossGradientScale(unit, dLoss): unit · dLoss in unit's dtype, or unit itself (no copy of a
// vocabulary-sized dW) when dLoss is exactly 1 and on the host, as loss.backward() makes it on the
// CPU. On a device it always multiplies: reading dLoss there would be a host wait.
void loss_gradient_scale_kernel(KernelCtx& c) {
  const at::Tensor& unit = c.input(0);
  const at::Tensor& dloss = c.input(1);
  if (dloss.numel() != 1)
    c.fail("the loss's gradient must be a scalar (the loss is a mean or a sum), got " + c10::str(dloss.sizes()));
  if (dloss.is_cpu() && dloss.item<double>() == 1.0) return c.set_output(0, unit);
  c.set_output(0, at::mul(unit, dloss.reshape({}).to(unit.scalar_type())));
}

}  // namespace

REGISTER_KERNEL_IN(kOurDomain, "LinearCrossEntropy", linear_cross_entropy_kernel);
REGISTER_KERNEL_IN(kOurDomain, "LossGradientScale", loss_gradient_scale_kernel);

}  // namespace torch_ort::kernels
