// Kernels: one registry line per op, REGISTER_KERNEL("Gemm", gemm_kernel), each a plain
// function void(KernelCtx&) that reads input tensors and attributes and sets output tensors.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "csrc/core/ir/graph.h"
#include "csrc/core/ir/op_registry.h"

namespace torch_ort {

class KernelCtx;
using KernelFn = void (*)(KernelCtx&);

// Device→host reads (planner/placement.h): every ToHost step, and any host read of a tensor that
// is not on the CPU. Counted on every device — on the CPU as if the values lived on a device — into
// the innermost open scope of this thread (the engine opens one per forward and backward call).
class HostReadScope {
 public:
  explicit HostReadScope(int64_t* sink);
  ~HostReadScope();
  HostReadScope(const HostReadScope&) = delete;
  HostReadScope& operator=(const HostReadScope&) = delete;
  static void add(int64_t n = 1);  // into the open scope, if any

 private:
  int64_t* prev_;
};

// The labels LabelRows saw in one forward (label sparsity): how many counted, of how many, into
// the innermost open scope of this thread (the engine opens one per forward call). A host number
// already, so counting costs no read.
struct LabelCount {
  int64_t valid = 0, total = 0;
  int64_t rows_kept = 0, rows_total = 0;  // padding elimination's PaddingRows
};
class LabelCountScope {
 public:
  explicit LabelCountScope(LabelCount* sink);
  ~LabelCountScope();
  LabelCountScope(const LabelCountScope&) = delete;
  LabelCountScope& operator=(const LabelCountScope&) = delete;
  static void add(int64_t valid, int64_t total);  // into the open scope, if any
  static void add_rows(int64_t kept, int64_t total);

 private:
  LabelCount* prev_;
};

// While open on this thread, the runtime is being captured into a CUDA graph: device buffers a
// step keeps across runs (ToDevice's uploads) and that the capture reads are kept for the
// engine's lifetime, since a replay reads them without running the step again.
class CaptureScope {
 public:
  CaptureScope();
  ~CaptureScope();
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;
  static bool active();

 private:
  bool prev_;
};

// ToDevice's state across runs: the device copies of the host values it uploaded, reused while
// the values are the same (they are shapes: the same for every step of one input size), so a
// steady-state step uploads nothing. Unkept entries are bounded (least recently used first).
struct UploadCache {
  struct Entry {
    c10::Device device = c10::Device(c10::kCPU);
    at::Tensor host;       // the values (a CPU copy)
    at::Tensor on_device;  // their device copy, shared read-only by every reader
    bool kept = false;     // read by a CUDA graph capture (CaptureScope): never evicted
  };
  static constexpr size_t kMaxUnkept = 8;
  std::mutex mu;
  std::vector<Entry> entries;  // most recently used last
};

// What a kernel sees of one node for one run: its slots, attributes, and the node for errors.
// Built on the stack by the executor per step; holds only pointers.
class KernelCtx {
 public:
  KernelCtx(const Node& node, int64_t opset, c10::Device device, const ValueId* in, int n_in,
            const ValueId* out, int n_out, std::vector<at::Tensor>& slots,
            const std::vector<bool>* none_ok = nullptr, int inplace = -1,
            const std::vector<char>* host_in = nullptr, UploadCache* upload = nullptr)
      : node(node), attrs(node.attrs), opset(opset), device(device), upload(upload), in_(in),
        n_in_(n_in), out_(out), n_out_(n_out), slots_(slots), none_ok_(none_ok), inplace_(inplace),
        host_in_(host_in) {}

  const Node& node;         // for error messages
  const Attributes& attrs;  // = node.attrs
  int64_t opset;            // opset of the node's domain (ONNX semantics change across versions)
  c10::Device device;       // where this step computes (the CPU for host steps); new tensors go here
  UploadCache* upload;      // ToDevice's cache (nullptr for other steps)

  int num_inputs() const { return n_in_; }
  bool has_input(int i) const { return i >= 0 && i < n_in_ && in_[i] != kNoValue; }
  // Throws KernelError naming the node when the input is absent or was never computed.
  const at::Tensor& input(int i) const;
  // Host reads: only of inputs the host-input table declares (planner/placement.cc; anything
  // else is an internal error naming the op), which placement keeps on the host, so no read
  // waits for the device. A read of a tensor not on the CPU copies it and counts (HostReadScope).
  // Integer values of an int32/int64 input (shape, axes).
  std::vector<int64_t> input_ints(int i) const;
  // A scalar input as double (Dropout ratio); `dflt` when the optional input is absent.
  double input_scalar(int i, double dflt) const;
  // A scalar input as bool (Dropout's training_mode); `dflt` when the optional input is absent.
  bool input_flag(int i, bool dflt) const;
  // A one-element input as an ATen scalar, in its own type (ATenOp arguments).
  c10::Scalar input_item(int i) const;

  int num_outputs() const { return n_out_; }
  // False when the output is omitted or nobody reads it: kernels may skip computing it.
  bool output_wanted(int i) const { return i >= 0 && i < n_out_ && out_[i] != kNoValue; }
  void set_output(int i, at::Tensor t);  // dropped silently when !output_wanted(i)
  // True when output i may be left unset ("no gradient", as autograd's None): the executor
  // allows it only for gradient outputs that no node reads (see CompiledStep::none_ok).
  bool output_may_be_none(int i) const {
    return none_ok_ && i >= 0 && i < static_cast<int>(none_ok_->size()) && (*none_ok_)[i];
  }

  // True when output 0 may be written over input i's buffer: the plan chose input i (its value
  // dies at this step; Step::inplace), nothing but this step's slot holds the buffer, and it is a
  // dense, contiguous tensor of `dtype` with `sizes` (the output's) on this run's device.
  // Kernels that honour it compute the same values either way (same operation order).
  bool may_overwrite_input(int i, c10::IntArrayRef sizes, at::ScalarType dtype) const;

  [[noreturn]] void fail(const std::string& msg) const;  // KernelError "<op> (node n): msg"

 private:
  const ValueId* in_;
  int n_in_;
  const ValueId* out_;
  int n_out_;
  std::vector<at::Tensor>& slots_;
  const std::vector<bool>* none_ok_;
  int inplace_;
  const std::vector<char>* host_in_;  // per input: declared a host input (nullptr: none is)

  // Input i, checked to be a declared host input, on the CPU (copied and counted if not).
  at::Tensor host_input(int i) const;
};

class KernelRegistry : public OpRegistry<KernelFn> {
 public:
  static KernelRegistry& instance();
  KernelFn find(const std::string& domain, const std::string& op) const {  // nullptr if none
    const KernelFn* fn = entry(domain, op);
    return fn ? *fn : nullptr;
  }

 private:
  KernelRegistry() : OpRegistry("kernel") {}
};

#ifndef TORCH_ORT_CONCAT
#define TORCH_ORT_CONCAT_INNER(a, b) a##b
#define TORCH_ORT_CONCAT(a, b) TORCH_ORT_CONCAT_INNER(a, b)
#endif
// All runtime sources link straight into the extension (no static archive), so these
// static-init registrations are never dropped by the linker.
#define REGISTER_KERNEL_IN(domain, op, fn)                  \
  static const bool TORCH_ORT_CONCAT(kKernelReg_, __COUNTER__) = \
      ::torch_ort::KernelRegistry::instance().add(domain, op, fn)
#define REGISTER_KERNEL(op, fn) REGISTER_KERNEL_IN("", op, fn)

}  // namespace torch_ort
