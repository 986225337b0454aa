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
  // False for lowerings later stages depend on (no kernel or gradient rule handles what they
  // remove); naming such a pass in disabled_passes is an error.
  virtual bool can_disable() const { return true; }
};

struct PipelineOptions {
  std::set<std::string> disabled;  // pass names to skip
  bool verify_after_each = false;  // tests: run the verifier after every pass, naming the pass
};

// The ordered list of passes run on the imported forward graph (see pipeline.cc for reasons).
std::vector<std::unique_ptr<Pass>> default_forward_pipeline();
// The passes run on the forward+backward graph after autodiff: cleanups of what the gradient rules
// emit (duplicate transposes and shapes, transposes a GEMM can absorb, dead nodes).
std::vector<std::unique_ptr<Pass>> default_training_pipeline();
// Every pass name of both pipelines, in pipeline order, each once (for disabled-name checks).
std::vector<std::string> pass_names();
// The passes that cannot be disabled (Pass::can_disable() is false).
std::vector<std::string> required_pass_names();
// Runs passes in order; returns the names of the passes that changed the graph.
std::vector<std::string> run_pipeline(Graph& g, const std::vector<std::unique_ptr<Pass>>& passes,
                                      const PipelineOptions& opts);

struct TrainingGraph;
// Runs passes over a training graph as over a plain graph whose inputs also hold the incoming
// output gradients and whose outputs also hold the input gradients, so that no pass needs to know
// about the split. Passes may rewrite nodes in place, remove nodes and insert nodes; afterwards a
// node runs in backward if it was marked so (Node::in_backward) or reads a backward value, and the
// forward nodes are moved ahead of the backward ones (stable) and counted again.
std::vector<std::string> run_training_pipeline(TrainingGraph& tg,
                                               const std::vector<std::unique_ptr<Pass>>& passes,
                                               const PipelineOptions& opts);

std::unique_ptr<Pass> make_dce_pass();  // removes nodes whose outputs reach no graph output
std::unique_ptr<Pass> make_sequence_to_split_pass();  // SplitToSequence + SequenceAt -> Split or Slices
std::unique_ptr<Pass> make_constant_folding_pass();  // Constant nodes and shape arithmetic -> initializers
std::unique_ptr<Pass> make_cse_pass();  // same op, attributes and inputs -> one node
std::unique_ptr<Pass> make_attention_fusion_pass();  // attention subgraph -> com.torch_ort::Attention
std::unique_ptr<Pass> make_softmax_cross_entropy_fusion_pass();  // LogSoftmax + NLL loss -> SoftmaxCrossEntropyLoss
std::unique_ptr<Pass> make_label_sparsity_pass();  // a loss over ignored labels -> the valid rows gathered before the LM head
std::unique_ptr<Pass> make_linear_cross_entropy_fusion_pass();  // LM head + its loss -> LinearCrossEntropy (chunked)
std::unique_ptr<Pass> make_padding_elimination_pass();  // token-wise work on the rows whose attention_mask is 1
std::unique_ptr<Pass> make_bias_gelu_fusion_pass();  // Add(x, bias) -> Gelu (op or decomposed) -> BiasGelu
std::unique_ptr<Pass> make_skip_layer_norm_fusion_pass();  // Add(+bias) + LayerNorm -> SkipLayerNorm
std::unique_ptr<Pass> make_bias_dropout_fusion_pass();  // Add(bias) + Dropout + Add(residual) -> BiasDropout
std::unique_ptr<Pass> make_matmul_bias_fusion_pass();  // MatMul + bias Add -> FusedMatMul (addmm)
std::unique_ptr<Pass> make_transpose_matmul_fusion_pass();  // Transpose(last 2 dims) -> GEMM flags
std::unique_ptr<Pass> make_elementwise_chain_fusion_pass();  // elementwise chains -> FusedElementwise
std::unique_ptr<Pass> make_split_grad_join_pass();  // SplitGrad of one FusedElementwiseGrad's outputs -> its join

}  // namespace torch_ort
