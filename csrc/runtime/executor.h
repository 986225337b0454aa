// The executor: a plan's steps compiled once into kernel calls over tensor slots (one slot per
// ValueId), then run as a flat loop that frees every buffer right after its last use.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "csrc/core/planner/plan.h"
#include "csrc/runtime/kernel.h"

namespace torch_ort {

// One step, resolved at engine build time: nothing is looked up while running.
struct CompiledStep {
  KernelFn fn;                      // from the kernel registry
  const Node* node;                 // into the engine's graph (attrs, error messages)
  int64_t opset;                    // of the node's domain
  std::vector<ValueId> inputs;      // kNoValue: omitted optional input
  std::vector<ValueId> outputs;     // kNoValue: omitted, or produced but never read
  std::vector<ValueId> free_after;  // slots dropped right after this step
  std::vector<bool> none_ok;        // per output: may stay unset (a None gradient no node reads)
  bool caller_autocast = false;     // runs under the caller's autocast state (PythonOp, ATenOpGrad)
};

// Per value: does any node, graph output or extra root read it? (Unread outputs are skipped.)
std::vector<char> values_read(const Graph& g, const std::vector<ValueId>& extra_roots);

// Resolves the kernel of every step. Throws UnsupportedOpError naming each op without a kernel
// and its node, so an unsupported model fails when the engine is built, not at the first run.
std::vector<CompiledStep> compile_steps(const Graph& g, const std::vector<Step>& steps,
                                        const std::vector<char>& read);

// Runs the steps over `slots`. Kernel failures become KernelError naming the op and the node.
// The graph already holds autocast's casts, so kernels run with autocast off; steps marked
// caller_autocast run user code or PyTorch autograd and see the caller's state, as in eager.
void run_steps(const std::vector<CompiledStep>& steps, std::vector<at::Tensor>& slots,
               c10::Device device);

}  // namespace torch_ort
