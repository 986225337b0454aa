// Compiling plan steps to kernel calls, and the run loop.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "csrc/runtime/executor.h"

#include <optional>
#include <set>
#include <string>

#include <ATen/record_function.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include "csrc/core/ir/aten_op.h"
#include "csrc/core/ir/errors.h"
#include "csrc/runtime/errors.h"

namespace torch_ort {

std::vector<char> values_read(const Graph& g, const std::vector<ValueId>& extra_roots) {
  std::vector<char> read(g.num_values(), 0);
  for (const Node& n : g.nodes)
    for (ValueId v : n.inputs)
      if (v != kNoValue) read[v] = 1;
  for (ValueId v : g.outputs) read[v] = 1;
  for (ValueId v : extra_roots)
    if (v != kNoValue) read[v] = 1;
  return read;
}

std::vector<CompiledStep> compile_steps(const Graph& g, const std::vector<Step>& steps,
                                        const std::vector<char>& read, const Placement& placement) {
  const auto& registry = KernelRegistry::instance();
  // Autograd's "no gradient" (None) may reach the caller only where no node consumes the value.
  std::vector<char> node_read(g.num_values(), 0);
  for (const Node& n : g.nodes)
    for (ValueId v : n.inputs)
      if (v != kNoValue) node_read[v] = 1;
  std::vector<CompiledStep> out;
  std::vector<std::string> missing;  // every unsupported op at once, not one per rebuild
  std::vector<UnsupportedNode> nodes;  // every node of those ops, as data for the ATen fallback
  std::set<std::string> seen;
  for (const Step& s : steps) {
    const Node& n = g.nodes.at(static_cast<size_t>(s.node));
    KernelFn fn = registry.find(n.domain, n.op_type);
    if (!fn) {
      const std::string op = n.domain.empty() ? n.op_type : n.domain + "::" + n.op_type;
      if (seen.insert(op).second) missing.push_back("'" + op + "' (node " + n.name + ")");
      nodes.push_back({n.name, n.domain, n.op_type, "kernel"});
      continue;
    }
    auto it = g.opset_imports.find(n.domain);
    CompiledStep cs{fn, &n, it == g.opset_imports.end() ? 1 : it->second, n.inputs, n.outputs,
                    s.free_after};
    cs.inplace = s.inplace;
    for (ValueId& v : cs.outputs)
      if (v != kNoValue && !read[v]) v = kNoValue;  // kernels may skip unread outputs
    if (n.domain == kOurDomain && n.op_type == kAtenOpGrad)
      for (ValueId v : cs.outputs) cs.none_ok.push_back(v != kNoValue && !node_read[v]);
    // A Function's forward, and autograd's backward (a Function's backward, an ATen op's), run
    // under the caller's autocast state as they would in eager.
    cs.caller_autocast =
        n.domain == kOurDomain && (n.op_type == kPythonOp || n.op_type == kAtenOpGrad);
    cs.on_host = placement.computes_on_host(s.node);
    cs.host_in.assign(n.inputs.size(), 0);
    for (int i : host_inputs(n)) cs.host_in[i] = 1;
    for (ValueId v : cs.outputs) cs.untracked.push_back(placement.on_host(v) || placement.is_upload(v));
    if (n.domain == kOurDomain && n.op_type == kToDevice) cs.upload = std::make_shared<UploadCache>();
    cs.profile_name = "torch_ort::" + n.op_type;
    if (n.attrs.has("aten_op")) cs.profile_name += " " + n.attrs.get_string("aten_op", "");
    out.push_back(std::move(cs));
  }
  if (!missing.empty()) {
    std::string msg = "Unsupported op " + missing[0];
    if (missing.size() > 1) {
      msg += " (and " + std::to_string(missing.size() - 1) + " more:";
      for (size_t i = 1; i < missing.size(); ++i) msg += " " + missing[i];
      msg += ")";
    }
    throw UnsupportedOpError(msg + " — no kernel; set ORTMODULE_FALLBACK_POLICY to run the module "
                                   "in PyTorch instead, or open an issue", std::move(nodes));
  }
  return out;
}

namespace {
const void* buffer_of(const at::Tensor& t) {
  return t.defined() && t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
}
}  // namespace

void LiveBytes::exclude(const at::Tensor& t) {
  if (const void* b = buffer_of(t)) excluded_.emplace(b, t.storage());
}

void LiveBytes::add(const at::Tensor& t) {
  const void* b = buffer_of(t);
  if (!b || excluded_.count(b)) return;
  auto [it, fresh] = held_.try_emplace(b, 0, static_cast<int64_t>(t.storage().nbytes()));
  if (fresh) current_ += it->second.second;
  ++it->second.first;
}

void LiveBytes::remove(const at::Tensor& t) {
  auto it = held_.find(buffer_of(t));
  if (it == held_.end() || --it->second.first > 0) return;
  current_ -= it->second.second;
  held_.erase(it);
}

int64_t LiveBytes::unique_bytes(const std::vector<at::Tensor>& tensors) const {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    const void* b = buffer_of(t);
    if (b && !excluded_.count(b) && seen.insert(b).second)
      bytes += static_cast<int64_t>(t.storage().nbytes());
  }
  return bytes;
}

void run_steps(const std::vector<CompiledStep>& steps, std::vector<at::Tensor>& slots,
               c10::Device device, LiveBytes* live, HostStepRun* host) {
  run_steps(steps, 0, steps.size(), slots, device, live, host);
}

namespace {
// After a step set its outputs (ran, or bound from the host cache): the count, then the frees.
void account_and_free(const CompiledStep& s, std::vector<at::Tensor>& slots, LiveBytes* live) {
  if (live) {
    // Host values and uploads are not activation memory; excluding their buffers also leaves
    // out device views of them (on the CPU an upload is the host value itself).
    for (size_t i = 0; i < s.outputs.size(); ++i) {
      if (s.outputs[i] == kNoValue) continue;
      if (s.untracked[i]) live->exclude(slots[s.outputs[i]]);
      else live->add(slots[s.outputs[i]]);
    }
    live->sample();
    for (ValueId v : s.free_after) live->remove(slots[v]);
  }
  for (ValueId v : s.free_after) slots[v] = at::Tensor();
}
}  // namespace

void run_steps(const std::vector<CompiledStep>& steps, size_t begin, size_t end,
               std::vector<at::Tensor>& slots, c10::Device device, LiveBytes* live,
               HostStepRun* host) {
  for (size_t k = begin; k < end; ++k) {
    const CompiledStep& s = steps[k];
    if (host && host->replay && s.cache_index >= 0 && bind_cached(s, *host, slots)) {
      account_and_free(s, slots, live);
      continue;
    }
    KernelCtx ctx(*s.node, s.opset, s.on_host ? c10::Device(c10::kCPU) : device, s.inputs.data(),
                  static_cast<int>(s.inputs.size()), s.outputs.data(),
                  static_cast<int>(s.outputs.size()), slots, &s.none_ok, s.inplace, &s.host_in,
                  s.upload.get());
    std::optional<c10::impl::ExcludeDispatchKeyGuard> no_autocast;
    if (!s.caller_autocast) no_autocast.emplace(c10::autocast_dispatch_keyset);
    // One range per node in torch.profiler (a flag check when no profiler is recording).
    RECORD_USER_SCOPE(s.profile_name.c_str());
    try {
      s.fn(ctx);
    } catch (const KernelError&) {
      throw;  // already names the node
    } catch (const c10::Error& e) {
      throw KernelError(s.node->describe() + ": " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw KernelError(s.node->describe() + ": " + e.what());
    }
    for (size_t i = 0; i < s.outputs.size(); ++i)
      if (s.outputs[i] != kNoValue && !slots[s.outputs[i]].defined() &&
          !(i < s.none_ok.size() && s.none_ok[i]))
        throw KernelError(s.node->describe() + ": kernel did not produce output " +
                          std::to_string(i));
    if (host) {
      host->ran += s.on_host;
      if (host->record && s.cache_index >= 0) record_cached(s, *host, slots);
    }
    account_and_free(s, slots, live);
  }
}

}  // namespace torch_ort
