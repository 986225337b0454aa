// Graph passes: one interface, an explicit ordered pipeline, any pass disabled by name.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "csrc/core/ir/graph.h"

namespace torch_ort {

struct Pass {
  virtual ~Pass() = default;
  virtual std::string_view name() const = 0;
  virtual bool run(Graph& g) = 0;  // returns whether the graph changed
};

struct PipelineOptions {
  std::set<std::string> disabled;  // pass names to skip
  bool verify_after_each = false;  // tests: run the verifier after every pass, naming the pass
};

// The ordered list of passes run on the imported forward graph (see pipeline.cc for reasons).
std::vector<std::unique_ptr<Pass>> default_forward_pipeline();
// Runs passes in order; returns the names of the passes that changed the graph.
std::vector<std::string> run_pipeline(Graph& g, const std::vector<std::unique_ptr<Pass>>& passes,
                                      const PipelineOptions& opts);

std::unique_ptr<Pass> make_dce_pass();  // removes nodes whose outputs reach no graph output
std::unique_ptr<Pass> make_sequence_to_split_pass();  // SplitToSequence + SequenceAt -> Split

}  // namespace torch_ort
