// The ordered pass pipeline over the imported forward graph, and the driver that runs it.
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"

namespace torch_ort {

std::vector<std::unique_ptr<Pass>> default_forward_pipeline() {
  std::vector<std::unique_ptr<Pass>> p;
  // sequence_to_split first: it removes sequence values, which no later pass, kernel or gradient
  // rule handles, and leaves the position constants dead for dce.
  p.push_back(make_sequence_to_split_pass());
  // dce runs last: every rewrite before it may orphan nodes, and autodiff (which follows the
  // pipeline) must never build gradients for work whose result nobody reads.
  p.push_back(make_dce_pass());
  return p;
}

std::vector<std::string> run_pipeline(Graph& g, const std::vector<std::unique_ptr<Pass>>& passes,
                                      const PipelineOptions& opts) {
  std::vector<std::string> changed;
  for (const auto& pass : passes) {
    const std::string name(pass->name());
    if (opts.disabled.count(name)) continue;
    if (pass->run(g)) changed.push_back(name);
    if (opts.verify_after_each) {
      try {
        verify(g);
      } catch (const VerifyError& e) {
        throw VerifyError("after pass '" + name + "': " + e.what());
      }
    }
  }
  return changed;
}

}  // namespace torch_ort
