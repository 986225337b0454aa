// The process-wide kernel table and the out-of-line parts of KernelCtx.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "csrc/runtime/kernel.h"

#include <stdexcept>

#include "csrc/runtime/errors.h"

namespace torch_ort {

KernelRegistry& KernelRegistry::instance() {
  static KernelRegistry r;  // function-local: safe under any static-init order
  return r;
}

void KernelCtx::fail(const std::string& msg) const {
  throw KernelError(node.describe() + ": " + msg);
}

const at::Tensor& KernelCtx::input(int i) const {
  if (!has_input(i)) fail("input " + std::to_string(i) + " is required but absent");
  const at::Tensor& t = slots_[in_[i]];
  // An undefined slot means the planner freed (or never produced) a value still needed.
  if (!t.defined()) fail("input " + std::to_string(i) + " was not computed or already freed");
  return t;
}

namespace {
thread_local int64_t* t_host_reads = nullptr;
thread_local LabelCount* t_label_count = nullptr;
thread_local bool t_capturing = false;
}  // namespace

HostReadScope::HostReadScope(int64_t* sink) : prev_(t_host_reads) { t_host_reads = sink; }
HostReadScope::~HostReadScope() { t_host_reads = prev_; }
void HostReadScope::add(int64_t n) {
  if (t_host_reads) *t_host_reads += n;
}

LabelCountScope::LabelCountScope(LabelCount* sink) : prev_(t_label_count) { t_label_count = sink; }
LabelCountScope::~LabelCountScope() { t_label_count = prev_; }
void LabelCountScope::add(int64_t valid, int64_t total) {
  if (!t_label_count) return;
  t_label_count->valid += valid;
  t_label_count->total += total;
}
void LabelCountScope::add_rows(int64_t kept, int64_t total) {
  if (!t_label_count) return;
  t_label_count->rows_kept += kept;
  t_label_count->rows_total += total;
}

CaptureScope::CaptureScope() : prev_(t_capturing) { t_capturing = true; }
CaptureScope::~CaptureScope() { t_capturing = prev_; }
bool CaptureScope::active() { return t_capturing; }

at::Tensor KernelCtx::host_input(int i) const {
  if (!host_in_ || i < 0 || i >= static_cast<int>(host_in_->size()) || !(*host_in_)[i])
    throw std::logic_error("internal: " + node.describe() + " reads input " + std::to_string(i) +
                           " on the host, but the host-input table (csrc/core/planner/"
                           "placement.cc) does not declare it, so placement may leave it on the "
                           "device");
  const at::Tensor& t = input(i);
  if (t.is_cpu()) return t;
  HostReadScope::add();  // a device->host copy: the host waits for the device queue
  return t.to(at::kCPU);
}

std::vector<int64_t> KernelCtx::input_ints(int i) const {
  const at::Tensor t = host_input(i);
  if (t.scalar_type() != at::kLong && t.scalar_type() != at::kInt)
    fail("input " + std::to_string(i) + " must be int64 or int32, got " +
         std::string(c10::toString(t.scalar_type())));
  at::Tensor h = t.to(at::kLong).contiguous();
  const int64_t* p = h.const_data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + h.numel());
}

c10::Scalar KernelCtx::input_item(int i) const {
  const at::Tensor t = host_input(i);
  if (t.numel() != 1)
    fail("input " + std::to_string(i) + " must hold one value, got shape " + c10::str(t.sizes()));
  return t.item();  // a CPU tensor: no device wait
}

double KernelCtx::input_scalar(int i, double dflt) const {
  return has_input(i) ? input_item(i).toDouble() : dflt;
}

bool KernelCtx::input_flag(int i, bool dflt) const {
  return has_input(i) ? input_item(i).toBool() : dflt;
}

bool KernelCtx::may_overwrite_input(int i, c10::IntArrayRef sizes, at::ScalarType dtype) const {
  if (i != inplace_ || !has_input(i)) return false;
  const at::Tensor& t = slots_[in_[i]];
  // use_count 1: only the slot holds this tensor; the storage's 1: no view of it lives anywhere
  // (a saved value, an output the caller holds, the cached zero of an absent gradient).
  return t.defined() && t.use_count() == 1 && t.storage().use_count() == 1 &&
         t.device() == device && t.scalar_type() == dtype && t.sizes().equals(sizes) &&
         t.is_contiguous() && t.layout() == at::kStrided && !t.is_neg() && !t.is_conj() &&
         t.storage_offset() == 0 && t.storage().nbytes() == static_cast<size_t>(t.nbytes());
}

void KernelCtx::set_output(int i, at::Tensor t) {
  if (output_wanted(i)) slots_[out_[i]] = std::move(t);
}

}  // namespace torch_ort
