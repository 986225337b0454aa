// Engine::backward and its pieces: begin (bind the output gradients), take (run up to a step,
// hand over finished input gradients), and when each input's gradient is finished.
#include <algorithm>
#include <stdexcept>
#include <string>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros.h>

#include "csrc/core/ir/aten_op.h"
#include "csrc/runtime/dtype.h"
#include "csrc/runtime/engine.h"
#include "csrc/runtime/errors.h"
#include "csrc/runtime/kernels/common.h"

namespace torch_ort {

void Engine::compute_input_grad_ready() {
  const Graph& g = tg_->graph;
  // ATenOp/PythonOp forward nodes count too: the memory optimizer may recompute them in backward.
  backward_opaque_ = std::any_of(backward_steps_.begin(), backward_steps_.end(),
                                 [](const CompiledStep& s) { return torch_ort::runs_opaque_code(*s.node); });
  const std::vector<ValueLayout> layouts = value_layouts(g);
  // Per buffer (base value): the number of backward steps up to the last one that reads or
  // writes it through any value living in it (0: backward never touches it).
  std::vector<int64_t> last(g.num_values(), 0);
  for (size_t s = 0; s < backward_steps_.size(); ++s)
    for (const auto* vs : {&backward_steps_[s].inputs, &backward_steps_[s].outputs})
      for (ValueId v : *vs)
        if (v != kNoValue) last[layouts[v].base] = static_cast<int64_t>(s) + 1;
  input_grad_ready_.assign(g.inputs.size(), -1);
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const ValueId gv = tg_->input_grads[i];
    if (gv == kNoValue) continue;
    // The input too: a hook that updates the parameter in place once its gradient arrived
    // must not change what a later step reads.
    input_grad_ready_[i] = std::max(last[layouts[gv].base], last[layouts[g.inputs[i]].base]);
  }
}

std::unique_ptr<BackwardRun> Engine::backward_begin(
    RunContext& ctx, const std::vector<std::optional<at::Tensor>>& grad_outputs) const {
  if (!tg_) throw RunContextError("backward called on an inference engine (training=False)");
  if (ctx.engine_id != id_) throw RunContextError("this RunContext was made by another engine");
  const Graph& g = tg_->graph;
  if (grad_outputs.size() != g.outputs.size())
    throw InputMismatchError("expected " + std::to_string(g.outputs.size()) +
                             " output gradients, got " + std::to_string(grad_outputs.size()));
  for (size_t i = 0; i < grad_outputs.size(); ++i) {  // all checked before the context is consumed
    const std::optional<at::Tensor>& go = grad_outputs[i];
    if (tg_->grad_of_outputs[i] == kNoValue || !go || !go->defined()) continue;
    const std::string what = "gradient of output " + std::to_string(i) + " '" +
                             g.value(g.outputs[i]).name + "'";
    if (go->scalar_type() != ctx.output_options[i].dtype().toScalarType())
      throw InputMismatchError(what + ": expected dtype " +
                               aten_dtype_name(ctx.output_options[i].dtype().toScalarType()) +
                               ", got " + aten_dtype_name(go->scalar_type()));
    if (!go->sizes().equals(ctx.output_sizes[i]))
      throw InputMismatchError(what + ": expected shape " + sizes_str(ctx.output_sizes[i]) +
                               ", got " + sizes_str(go->sizes()));
  }
  if (ctx.consumed.exchange(true))
    throw RunContextError("backward called twice on one RunContext: the first call freed its "
                          "saved activations (retain_graph=True is not supported); run forward again");
  auto run = std::make_unique<BackwardRun>();
  run->engine_id = id_;
  run->device = ctx.device;
  run->measured = ctx.measured;
  run->taken.assign(g.inputs.size(), 0);
  // Backward's host values belong to the signature its forward ran with.
  run->host_entry = std::move(ctx.host_entry);
  if (run->host_entry && stats_.host_cacheable_backward > 0) {
    run->host_values = host_cache_.backward_of(*run->host_entry);
    if (run->host_values) run->host.replay = run->host_values.get();
    else run->host.record = std::make_unique<HostValues>(stats_.host_cacheable_backward);
  }
  std::vector<at::Tensor>& slots = run->slots;
  slots.resize(g.num_values());
  for (const auto& [v, t] : constants_on(ctx.device)) slots[v] = t;
  for (auto& [v, t] : ctx.saved) slots[v] = std::move(t);
  ctx.saved.clear();  // backward owns them now and frees each after its last use
  for (size_t i = 0; i < grad_outputs.size(); ++i) {
    const ValueId gv = tg_->grad_of_outputs[i];
    if (gv == kNoValue) continue;  // not differentiable: whatever came is ignored
    const std::optional<at::Tensor>& go = grad_outputs[i];
    slots[gv] = go && go->defined() ? *go
                                    : kernels::absent_gradient(ctx.output_sizes[i], ctx.output_options[i]);
  }
  if (ctx.measured.forward_peak >= 0) {  // forward was measured: measure this half too
    LiveBytes& live = run->live.emplace();
    live.exclude(ctx.untracked);  // constants, graph inputs and views of them
    for (ValueId v : tg_->grad_of_outputs)
      if (v != kNoValue) live.exclude(slots[v]);  // autograd's
    for (ValueId v = 0; v < static_cast<ValueId>(slots.size()); ++v) {
      if (plan_.placement.on_host(v) || plan_.placement.is_upload(v)) live.exclude(slots[v]);
      else live.add(slots[v]);
    }
    live.sample();
  }
  return run;
}

std::vector<std::optional<at::Tensor>> Engine::backward_take(
    BackwardRun& run, int64_t steps, const std::vector<int64_t>& inputs) const {
  if (!tg_ || run.engine_id != id_)
    throw RunContextError("backward_take: this BackwardRun was begun by another engine");
  const Graph& g = tg_->graph;
  const size_t end = steps < 0 ? backward_steps_.size()
                               : std::min<size_t>(static_cast<size_t>(steps), backward_steps_.size());
  for (int64_t i : inputs) {
    if (i < 0 || i >= static_cast<int64_t>(g.inputs.size()))
      throw std::out_of_range("backward_take: no graph input " + std::to_string(i));
    if (run.taken[i])
      throw RunContextError("backward_take: the gradient of input " + std::to_string(i) +
                            " was handed over already");
    if (std::max(end, run.next) < static_cast<size_t>(std::max<int64_t>(input_grad_ready_[i], 0)))
      throw std::logic_error("backward_take: the gradient of input " + std::to_string(i) +
                             " is final after " + std::to_string(input_grad_ready_[i]) +
                             " backward steps, not " + std::to_string(end));
  }
  if (end > run.next) {
    at::NoGradGuard no_grad;  // kernels must not record an autograd graph of their own
    HostReadScope reads(&run.host_reads);
    run_steps(backward_steps_, run.next, end, run.slots, run.device, run.live ? &*run.live : nullptr,
              &run.host);
    run.next = end;
  }
  if (run.next == backward_steps_.size() && !run.finished) {
    run.finished = true;
    last_host_reads_backward_ = run.host_reads;
    last_host_steps_backward_ = run.host.ran;
    last_host_steps_cached_backward_ = run.host.skipped;
    if (run.host.record && run.host_entry)
      host_cache_.set_backward(*run.host_entry, std::move(*run.host.record));
    run.host.record.reset();
    if (run.live) {
      MeasuredMemory m = run.measured;
      m.backward_peak = run.live->peak();
      m.peak = std::max(m.forward_peak, m.outputs + m.backward_peak);
      record_measured(m);
    }
  }
  for (int64_t i : inputs) run.taken[i] = 1;
  // An input whose gradient is also another input's, handed over later, gets a copy: the later
  // one keeps the engine's tensor (two parameters' .grad must never be one tensor). Within one
  // call the bridge un-aliases.
  auto later = [&](ValueId v) {
    for (size_t j = 0; j < g.inputs.size(); ++j)
      if (tg_->input_grads[j] == v && !run.taken[j]) return true;
    return false;
  };
  std::vector<std::optional<at::Tensor>> grads;
  for (int64_t i : inputs) {
    const ValueId v = tg_->input_grads[i];
    if (v == kNoValue || !run.slots[v].defined()) {
      grads.push_back(std::nullopt);
      continue;
    }
    const at::Tensor& t = run.slots[v];
    // A gradient that is only absent ones (an output nobody differentiated) leaves as a zero
    // tensor of its own: .grad must be writable, not a view of the shared zero.
    if (kernels::is_absent_gradient(t)) grads.push_back(at::zeros(t.sizes(), t.options()));
    else grads.push_back(later(v) ? t.clone() : t);
  }
  // Drop the engine's references to what was handed over, so autograd adopts the tensors as
  // .grad instead of copying them (it copies a gradient that something else still holds). The
  // live-bytes count keeps them, as the estimate does: they stay allocated, as .grad.
  for (int64_t i : inputs) {
    const ValueId v = tg_->input_grads[i];
    if (v == kNoValue || !run.slots[v].defined() || later(v)) continue;
    run.slots[v] = at::Tensor();
  }
  return grads;
}

std::vector<std::optional<at::Tensor>> Engine::backward(
    RunContext& ctx, const std::vector<std::optional<at::Tensor>>& grad_outputs) const {
  std::unique_ptr<BackwardRun> run = backward_begin(ctx, grad_outputs);
  std::vector<int64_t> all(tg_->graph.inputs.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  return backward_take(*run, -1, all);
}

}  // namespace torch_ort
