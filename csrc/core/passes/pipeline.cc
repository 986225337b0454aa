// The ordered pass pipeline over the imported forward graph, and the driver that runs it.
#include <algorithm>
#include <set>

#include "csrc/core/ir/training_graph.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"

namespace torch_ort {

std::vector<std::unique_ptr<Pass>> default_forward_pipeline() {
  std::vector<std::unique_ptr<Pass>> p;
  // sequence_to_split first: it removes sequence values, which no later pass, kernel or gradient
  // rule handles, and leaves the position constants dead for dce.
  p.push_back(make_sequence_to_split_pass());
  // constant_folding before everything that matches patterns: fusions then see initializers.
  p.push_back(make_constant_folding_pass());
  // cse after folding, whose equal per-layer constants it merges, and before the fusions.
  p.push_back(make_cse_pass());
  // attention_fusion before the MatMul/Transpose/elementwise fusions: they would rewrite its Q·Kᵀ chain.
  p.push_back(make_attention_fusion_pass());
  // softmax_cross_entropy_fusion: independent of the GEMM passes; after cse so one loss remains.
  p.push_back(make_softmax_cross_entropy_fusion_pass());
  // bias_gelu_fusion before matmul_bias_fusion: a bias feeding a GELU folds into BiasGelu's one pass.
  p.push_back(make_bias_gelu_fusion_pass());
  p.push_back(make_skip_layer_norm_fusion_pass());  // before bias_dropout: owns residual adds into an LN
  p.push_back(make_bias_dropout_fusion_pass());  // before matmul_bias: bias adds into a Dropout fuse here
  // matmul_bias_fusion before transpose folding, which then flags the fused GEMM's weight.
  p.push_back(make_matmul_bias_fusion_pass());
  // transpose_matmul_fusion after every pass that creates or rewrites GEMMs.
  p.push_back(make_transpose_matmul_fusion_pass());
  // label_sparsity after the GEMM passes (it matches the head as FusedMatMul with transB) and
  // before elementwise_chain_fusion, which could swallow the logits' Cast.
  p.push_back(make_label_sparsity_pass());
  // linear_cross_entropy_fusion after label_sparsity, whose gathered head and ProductRows it
  // takes in, and before elementwise_chain_fusion for the same reason as label_sparsity.
  p.push_back(make_linear_cross_entropy_fusion_pass());
  // padding_elimination after label_sparsity, whose row gather it keeps (its rows count), and
  // before elementwise_chain_fusion, whose FusedElementwise nodes would run on whatever rows it left.
  p.push_back(make_padding_elimination_pass());
  // elementwise_chain_fusion last among fusions: it takes only what no specific fusion claimed.
  p.push_back(make_elementwise_chain_fusion_pass());
  // dce runs last: every rewrite before it may orphan nodes, and autodiff (which follows the
  // pipeline) must never build gradients for work whose result nobody reads.
  p.push_back(make_dce_pass());
  return p;
}

std::vector<std::unique_ptr<Pass>> default_training_pipeline() {
  std::vector<std::unique_ptr<Pass>> p;
  // The gradient rules emit Shape nodes of dims that are known, per-rule copies of the same
  // Transpose/Shape/constant, and Transposes of weights for dX = dY·Wᵀ: fold, merge, absorb.
  p.push_back(make_constant_folding_pass());
  p.push_back(make_cse_pass());  // after folding, whose equal constants it merges
  p.push_back(make_transpose_matmul_fusion_pass());  // after cse: one Transpose per weight left
  // split_grad_join: the gradients of a fused chain over a Split's pieces written side by side.
  p.push_back(make_split_grad_join_pass());
  // dce last, as in the forward pipeline: the rewrites above orphan the nodes they bypassed.
  p.push_back(make_dce_pass());
  return p;
}

std::vector<std::string> pass_names() {
  std::vector<std::string> names;
  for (auto* make : {&default_forward_pipeline, &default_training_pipeline})
    for (const auto& pass : make())
      if (std::find(names.begin(), names.end(), pass->name()) == names.end())
        names.emplace_back(pass->name());
  return names;
}

std::vector<std::string> required_pass_names() {
  std::vector<std::string> names;
  for (auto* make : {&default_forward_pipeline, &default_training_pipeline})
    for (const auto& pass : make())
      if (!pass->can_disable() &&
          std::find(names.begin(), names.end(), pass->name()) == names.end())
        names.emplace_back(pass->name());
  return names;
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

std::vector<std::string> run_training_pipeline(TrainingGraph& tg,
                                               const std::vector<std::unique_ptr<Pass>>& passes,
                                               const PipelineOptions& opts) {
  Graph& g = tg.graph;
  for (size_t i = 0; i < g.nodes.size(); ++i) g.nodes[i].in_backward = i >= tg.num_forward_nodes;
  // The gradient values cross the graph's edge as inputs/outputs while passes run.
  const size_t n_inputs = g.inputs.size(), n_outputs = g.outputs.size();
  for (ValueId v : tg.grad_of_outputs)
    if (v != kNoValue) g.inputs.push_back(v);
  for (ValueId v : tg.input_grads)
    if (v != kNoValue) g.outputs.push_back(v);
  std::vector<std::string> changed = run_pipeline(g, passes, opts);
  g.inputs.resize(n_inputs);
  g.outputs.resize(n_outputs);

  // Phases again: a node reading an incoming gradient or a backward node's output is backward.
  std::vector<char> backward_value(g.num_values(), 0);
  for (ValueId v : tg.grad_of_outputs)
    if (v != kNoValue) backward_value[v] = 1;
  for (Node& n : g.nodes) {
    for (ValueId v : n.inputs) n.in_backward |= v != kNoValue && backward_value[v];
    if (n.in_backward)
      for (ValueId v : n.outputs)
        if (v != kNoValue) backward_value[v] = 1;
  }
  // A forward node never reads a backward value (just established), so moving the forward nodes
  // ahead keeps the order topological.
  std::stable_partition(g.nodes.begin(), g.nodes.end(), [](const Node& n) { return !n.in_backward; });
  tg.num_forward_nodes = static_cast<size_t>(std::count_if(
      g.nodes.begin(), g.nodes.end(), [](const Node& n) { return !n.in_backward; }));
  return changed;
}

}  // namespace torch_ort
