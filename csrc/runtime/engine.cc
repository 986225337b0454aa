// Engine build (import -> passes -> autodiff -> plan -> kernels) and the forward/backward calls.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "csrc/runtime/engine.h"

#include <algorithm>
#include <set>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros.h>

#include "csrc/core/ir/aten_op.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/onnx_io.h"
#include "csrc/runtime/buffer_pool.h"
#include "csrc/runtime/dtype.h"
#include "csrc/runtime/errors.h"
#include "csrc/runtime/kernels/common.h"

namespace torch_ort {
namespace {

std::atomic<uint64_t> g_next_engine_id{1};

}  // namespace

Engine::Engine(const std::string& onnx_bytes, EngineOptions options)
    : options_(std::move(options)), id_(g_next_engine_id++) {
  core::Compiled c = core::compile(onnx_bytes, options_);
  forward_ = std::move(c.forward);
  tg_ = std::move(c.training);
  recompute_ = std::move(c.recompute);
  plan_ = std::move(c.plan);
  timeline_ = std::move(c.timeline);
  stats_.passes_changed = std::move(c.passes_changed);
  stats_.kernel_workspace_bytes = c.kernel_workspace_bytes;
  stats_.recompute_nodes = recompute_.nodes_cloned;
  const Graph& eg = exec_graph();
  for (ValueId v : eg.inputs)
    input_types_.push_back(to_aten(eg.value(v).dtype, "graph input '" + eg.value(v).name + "'"));

  // Kernels are resolved for both halves before anything runs, so every unsupported op is
  // reported at build time.
  const std::vector<char> read = values_read(eg, tg_ ? tg_->input_grads : std::vector<ValueId>{});
  forward_steps_ = compile_steps(eg, plan_.forward, read, plan_.placement);
  backward_steps_ = compile_steps(eg, plan_.backward, read, plan_.placement);

  // Constants: initializers, plus Constant nodes evaluated once here instead of every run.
  auto& consts = constants_["cpu"];
  for (const auto& [v, data] : eg.initializers)
    consts.emplace_back(v, tensor_from_data(data, "initializer '" + eg.value(v).name + "'"));
  std::vector<at::Tensor> scratch(eg.num_values());
  for (auto* steps : {&forward_steps_, &backward_steps_}) {
    std::vector<CompiledStep> kept;
    for (CompiledStep& s : *steps) {
      if (!is_constant(*s.node)) {
        kept.push_back(std::move(s));
        continue;
      }
      if (s.outputs.empty() || s.outputs[0] == kNoValue) continue;  // unread: drop the step
      CompiledStep once = s;
      once.free_after.clear();
      run_steps({once}, scratch, c10::Device(c10::kCPU));
      consts.emplace_back(s.outputs[0], std::move(scratch[s.outputs[0]]));
    }
    *steps = std::move(kept);
  }

  stats_.num_forward_nodes = static_cast<int64_t>(tg_ ? tg_->num_forward_nodes : eg.nodes.size());
  stats_.num_backward_nodes = static_cast<int64_t>(eg.nodes.size()) - stats_.num_forward_nodes;
  stats_.num_forward_values = plan_.num_forward_values;
  stats_.num_saved_activations = plan_.num_saved_activations;
  stats_.num_saved = static_cast<int64_t>(plan_.saved.size());
  stats_.num_constants = static_cast<int64_t>(consts.size());
  stats_.host_nodes = plan_.placement.host_nodes;
  for (const auto* steps : {&forward_steps_, &backward_steps_})
    for (const CompiledStep& s : *steps) {
      opaque_ |= torch_ort::runs_opaque_code(*s.node);
      ++stats_.op_counts[s.node->domain.empty() ? s.node->op_type : s.node->domain + "::" + s.node->op_type];
      if (s.node->domain != kOurDomain) continue;
      const bool fwd = steps == &forward_steps_;
      if (s.node->op_type == kToHost) ++(fwd ? stats_.to_host_forward : stats_.to_host_backward);
      if (s.node->op_type == kToDevice) ++(fwd ? stats_.to_device_forward : stats_.to_device_backward);
    }
  for (ValueId v : plan_.saved) stats_.saved_names.push_back(eg.value(v).name);
  if (tg_) compute_input_grad_ready();

  // Host steps that compute shapes only: run once per input-shape signature (host_cache.h).
  std::vector<char> constant(eg.num_values(), 0);
  for (const auto& [v, _] : consts) constant[v] = 1;
  std::vector<ValueId> escaping = eg.outputs;  // what the caller receives
  if (tg_) escaping.insert(escaping.end(), tg_->input_grads.begin(), tg_->input_grads.end());
  const auto [fwd, bwd] =
      mark_cacheable_steps(eg, forward_steps_, backward_steps_, constant, escaping);
  stats_.host_cacheable_forward = fwd;
  stats_.host_cacheable_backward = bwd;
}

const std::vector<std::pair<ValueId, at::Tensor>>& Engine::constants_on(c10::Device device) const {
  std::lock_guard<std::mutex> lock(constants_mu_);
  const std::string key = device.str();
  auto it = constants_.find(key);
  if (it != constants_.end()) return it->second;
  std::vector<std::pair<ValueId, at::Tensor>> moved;
  for (const auto& [v, t] : constants_.at("cpu"))  // host constants stay where they are read
    moved.emplace_back(v, plan_.placement.on_host(v) ? t : t.to(device));
  return constants_.emplace(key, std::move(moved)).first->second;  // std::map: refs stay valid
}

void Engine::check_inputs(const std::vector<at::Tensor>& inputs) const {
  const Graph& g = exec_graph();
  if (inputs.size() != g.inputs.size()) {
    std::string names;
    for (ValueId v : g.inputs) names += (names.empty() ? "" : ", ") + g.value(v).name;
    throw InputMismatchError("expected " + std::to_string(g.inputs.size()) + " inputs (" + names +
                             "), got " + std::to_string(inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value& val = g.value(g.inputs[i]);
    const at::Tensor& t = inputs[i];
    const std::string what = "input " + std::to_string(i) + " '" + val.name + "'";
    if (!t.defined()) throw InputMismatchError(what + ": expected a tensor, got None");
    if (t.scalar_type() != input_types_[i])
      throw InputMismatchError(what + ": expected dtype " + std::string(dtype_name(val.dtype)) +
                               ", got " + aten_dtype_name(t.scalar_type()));
    if (t.device() != inputs[0].device())
      throw InputMismatchError(what + " is on " + t.device().str() + ", but input 0 is on " +
                               inputs[0].device().str() + "; all inputs must share one device");
    if (!val.shape.rank_known) continue;
    if (t.dim() != val.shape.rank())
      throw InputMismatchError(what + ": expected rank " + std::to_string(val.shape.rank()) + " " +
                               val.shape.to_string() + ", got rank " + std::to_string(t.dim()) +
                               " " + sizes_str(t.sizes()));
    for (int64_t d = 0; d < t.dim(); ++d) {
      const Dim& dim = val.shape.dims[d];
      if (dim.is_known() && dim.value != t.size(d))
        throw InputMismatchError(what + ": expected shape " + val.shape.to_string() + ", got " +
                                 sizes_str(t.sizes()) + " (dim " + std::to_string(d) + ")");
    }
  }
}

std::pair<std::vector<at::Tensor>, std::shared_ptr<RunContext>> Engine::forward(
    const std::vector<at::Tensor>& inputs) const {
  check_inputs(inputs);
  at::NoGradGuard no_grad;  // kernels must not record an autograd graph of their own
  const Graph& g = exec_graph();
  const c10::Device device = inputs.empty() ? c10::Device(c10::kCPU) : inputs[0].device();
  std::vector<at::Tensor> slots(g.num_values());
  for (const auto& [v, t] : constants_on(device)) slots[v] = t;
  for (size_t i = 0; i < inputs.size(); ++i) slots[g.inputs[i]] = inputs[i];
  std::optional<LiveBytes> live;
  if (track_memory_) {
    live.emplace();
    for (const at::Tensor& t : slots) live->exclude(t);  // inputs and constants
  }
  // The cacheable host steps: replayed when these input sizes were seen, else recorded.
  HostStepRun host;
  std::shared_ptr<HostCacheEntry> entry;
  std::vector<int64_t> key;
  const bool cached = stats_.host_cacheable_forward + stats_.host_cacheable_backward > 0;
  if (cached) {
    key = HostCache::key_of(inputs, device);
    entry = host_cache_.find(key);
    if (entry) host.replay = &entry->forward;
    else host.record = std::make_unique<HostValues>(stats_.host_cacheable_forward);
  }
  BufferPool::process().mark();  // buffers idle through the whole previous step go back
  int64_t host_reads = 0;
  LabelCount labels;
  {
    HostReadScope reads(&host_reads);
    LabelCountScope counted(&labels);
    run_steps(forward_steps_, slots, device, live ? &*live : nullptr, &host);
  }
  last_host_reads_forward_ = host_reads;
  last_label_density_ = labels.total > 0 ? static_cast<double>(labels.valid) / labels.total : -1.0;
  last_row_density_ = labels.rows_total > 0 ? static_cast<double>(labels.rows_kept) / labels.rows_total : -1.0;
  last_host_steps_forward_ = host.ran;
  last_host_steps_cached_forward_ = host.skipped;
  if (host.record) entry = host_cache_.insert(std::move(key), std::move(*host.record));
  if (host.diverged) entry = nullptr;  // its backward must compute its own host values

  std::vector<at::Tensor> outputs;
  for (ValueId v : g.outputs) {
    if (!slots[v].defined())
      throw std::logic_error("internal: graph output '" + g.value(v).name + "' was not computed");
    outputs.push_back(slots[v]);
  }
  if (!tg_) {
    if (live) record_measured({live->peak(), 0, live->unique_bytes(outputs), -1, live->peak()});
    return {std::move(outputs), nullptr};
  }

  auto ctx = std::make_shared<RunContext>();
  ctx->engine_id = id_;
  ctx->device = device;
  ctx->host_reads = host_reads;
  ctx->host_entry = std::move(entry);
  for (ValueId v : plan_.saved) {
    if (!slots[v].defined())
      throw std::logic_error("internal: saved value '" + g.value(v).name +
                             "' was freed before forward returned (planner bug)");
    ctx->saved.emplace_back(v, std::move(slots[v]));
  }
  for (const at::Tensor& o : outputs) {
    ctx->output_sizes.push_back(o.sizes().vec());
    ctx->output_options.push_back(o.options());
  }
  if (live) {  // inputs and constants are excluded already, so are views of them
    std::vector<at::Tensor> saved;
    for (const auto& [v, t] : ctx->saved) saved.push_back(t);
    ctx->measured.forward_peak = live->peak();
    ctx->measured.saved = live->unique_bytes(saved);
    ctx->untracked = live->excluded();  // backward counts what forward counted
    for (const at::Tensor& t : saved) live->exclude(t);
    ctx->measured.outputs = live->unique_bytes(outputs);  // those not also saved
  }
  return {std::move(outputs), std::move(ctx)};
}

void Engine::record_measured(const MeasuredMemory& m) const {
  std::lock_guard<std::mutex> lock(measured_mu_);
  measured_ = m;
}

MeasuredMemory Engine::measured_memory() const {
  std::lock_guard<std::mutex> lock(measured_mu_);
  return measured_;
}

MemoryReport Engine::memory_report(const std::vector<std::vector<int64_t>>& input_sizes) const {
  const Graph& g = exec_graph();
  if (input_sizes.size() != g.inputs.size())
    throw InputMismatchError("memory_report: expected sizes of " + std::to_string(g.inputs.size()) +
                             " inputs, got " + std::to_string(input_sizes.size()));
  const auto env = binding_of(g, input_sizes);
  const auto names = symbol_names(g);
  MemoryReport r;
  r.predicted = evaluate_peak(timeline_, env, names);
  r.recompute = recompute_;
  r.unknown_values = timeline_.unknown;
  for (const RecomputeOpportunity& o : recompute_.opportunities) {
    r.bytes_saved_each.push_back(o.bytes_saved_each.evaluate(env).value_or(-1));
    r.bytes_saved_formula.push_back(format_bytes_formula(o.bytes_saved_each, names));
  }
  return r;
}

std::vector<std::string> Engine::input_names() const {
  std::vector<std::string> out;
  for (ValueId v : exec_graph().inputs) out.push_back(exec_graph().value(v).name);
  return out;
}

std::vector<std::string> Engine::output_names() const {
  std::vector<std::string> out;
  for (ValueId v : exec_graph().outputs) out.push_back(exec_graph().value(v).name);
  return out;
}

std::vector<bool> Engine::output_differentiable() const {
  const Graph& g = exec_graph();
  std::vector<bool> out(g.outputs.size(), false);
  if (tg_)
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = is_floating(g.value(g.outputs[i]).dtype) && tg_->grad_of_outputs[i] != kNoValue;
  return out;
}

std::vector<bool> Engine::input_grad_available() const {
  std::vector<bool> out(exec_graph().inputs.size(), false);
  if (tg_)
    for (size_t i = 0; i < out.size(); ++i) out[i] = tg_->input_grads[i] != kNoValue;
  return out;
}

std::string Engine::forward_graph_onnx() const { return export_onnx(forward_); }

std::string Engine::training_graph_onnx() const {
  if (!tg_) throw RunContextError("training_graph_onnx: this engine was built with training=False");
  return export_onnx(as_exportable_graph(*tg_));
}

}  // namespace torch_ort
