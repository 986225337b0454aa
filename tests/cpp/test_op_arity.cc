// The arity table (csrc/core/ir/op_arity.h) and verify()'s use of it: every op the core has a
// shape rule for has an entry, and for every entry a node missing a required input or output, or
// with more than the op allows, is a VerifyError naming the node, the op and the count.
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/op_arity.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/shapes/shape_rules.h"
#include "ir_builders.h"

namespace torch_ort {
namespace {

using ::testing::HasSubstr;
using testing::fvalue;

std::pair<std::string, std::string> split_key(const std::string& key) {
  const size_t sep = key.find("::");
  return {key.substr(0, sep), key.substr(sep + 2)};
}

// Style rule 1: the tables are walked. A new shape rule (or gradient decision) without an arity
// entry is an op whose inputs a stage may read by position on a malformed node.
TEST(OpArity, EveryOpWithAShapeRuleOrGradientDecisionHasAnEntry) {
  std::vector<std::string> keys = ShapeRegistry::instance().ops();
  for (const std::string& k : GradientRegistry::instance().ops()) keys.push_back(k);
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    const auto [domain, op] = split_key(key);
    if (!find_op_arity(domain, op, domain.empty() ? 20 : 1)) missing.push_back(key);
  }
  EXPECT_TRUE(missing.empty()) << "no arity entry (ours: an .arity in the op's traits line, csrc/core/ops/<family>.cc): "
                               << ::testing::PrintToString(missing);
  EXPECT_GE(arity_ops().size(), ShapeRegistry::instance().ops().size());
}

// The reverse, for the hand-written rows of our domain: an entry names an op the core knows
// (catches a misspelt op, which would leave the real one unchecked). The ONNX rows are generated
// from onnx's schemas (scripts/gen_op_arity.py), every standard op, known to the core or not.
TEST(OpArity, EveryEntryOfOurDomainIsAnOpTheCoreKnows) {
  std::vector<std::string> unknown;
  for (const std::string& key : arity_ops()) {
    const auto [domain, op] = split_key(key);
    if (domain.empty()) continue;
    if (!ShapeRegistry::instance().find(domain, op) && !GradientRegistry::instance().find(domain, op))
      unknown.push_back(key);
  }
  EXPECT_TRUE(unknown.empty()) << ::testing::PrintToString(unknown);
}

TEST(OpArity, OnnxRowsComeFromEverySchemaAndItsHistory) {
  // Standard ops the core has no rules for are held to their schema too.
  for (const char* op : {"CumSum", "Pad", "Einsum", "LSTM"}) EXPECT_TRUE(find_op_arity("", op, 20)) << op;
  // Slice took starts/ends as attributes before opset 10, as inputs (3 to 5 of them) from 10 on.
  const std::optional<OpArity> slice9 = find_op_arity("", "Slice", 9);
  const std::optional<OpArity> slice13 = find_op_arity("", "Slice", 13);
  ASSERT_TRUE(slice9 && slice13);
  EXPECT_EQ(slice13->min_inputs, 3);
  EXPECT_EQ(slice13->max_inputs, 5);
  EXPECT_EQ(slice9->min_inputs, 1);  // the loosest of the forms in force at 9 or later
  EXPECT_FALSE(find_op_arity("", "NoSuchOp", 20));
}

// One node `n` of `op` in a graph importing `opset` of its domain; a slot is a fresh typed graph
// input / node output when present, kNoValue when not.
Graph one_node(const std::string& domain, const std::string& op, int64_t opset,
               const std::vector<bool>& ins, const std::vector<bool>& outs) {
  Graph g;
  g.opset_imports[domain] = opset;
  Node n{domain, op, "n", {}, {}, {}};
  if (domain.empty() && op == "Cast") n.attrs.set("to", static_cast<int64_t>(DType::kFloat));  // required
  for (size_t i = 0; i < ins.size(); ++i) {
    n.inputs.push_back(ins[i] ? fvalue(g, "x" + std::to_string(i)) : kNoValue);
    if (ins[i]) g.inputs.push_back(n.inputs.back());
  }
  for (size_t i = 0; i < outs.size(); ++i) n.outputs.push_back(outs[i] ? fvalue(g, "y" + std::to_string(i)) : kNoValue);
  g.nodes.push_back(std::move(n));
  return g;
}

std::string verify_error(const Graph& g) {
  try {
    verify(g);
  } catch (const VerifyError& e) {
    return e.what();
  }
  return "verify() accepted it";
}

// The slots of a well-formed node: the required ones, absent where the entry allows it.
std::vector<bool> required(int min, uint32_t optional) {
  std::vector<bool> s;
  for (int i = 0; i < min; ++i) s.push_back(!(i < 32 && (optional >> i & 1u)));
  return s;
}

// The last required slot that may not be absent, or -1.
int last_strict(const std::vector<bool>& s) {
  for (int i = static_cast<int>(s.size()); i-- > 0;)
    if (s[static_cast<size_t>(i)]) return i;
  return -1;
}

std::string plural(int n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); }

// For every entry (ONNX ops at every opset from 1 to 21), the minimal well-formed node verifies,
// and each way of breaking its arity is rejected with a message naming the node, the op and the
// count. Without the verifier's arity rule every one of these checks fails ("verify() accepted it").
TEST(OpArity, EveryEntryRejectsMissingAndExtraInputsAndOutputs) {
  std::map<std::string, int> rejections;  // per entry, over all opsets
  int checked = 0;
  for (const std::string& key : arity_ops()) {
    const std::string domain = split_key(key).first, op = split_key(key).second;
    rejections[key] = 0;
    const int64_t last_opset = domain.empty() ? 21 : 1;
    for (int64_t opset = 1; opset <= last_opset; ++opset) {
      SCOPED_TRACE(key + " at opset " + std::to_string(opset));
      const OpArity a = *find_op_arity(domain, op, opset);
      const std::vector<bool> ins = required(a.min_inputs, a.optional_inputs);
      const std::vector<bool> outs = required(a.min_outputs, a.optional_outputs);
      const std::string who = "node " + one_node(domain, op, opset, {}, {}).nodes[0].describe() + ": ";
      ASSERT_NO_THROW(verify(one_node(domain, op, opset, ins, outs)));
      auto rejected = [&](const std::vector<bool>& i, const std::vector<bool>& o, const std::string& why) {
        EXPECT_THAT(verify_error(one_node(domain, op, opset, i, o)), HasSubstr(who + why));
        ++rejections[key];
        ++checked;
      };
      if (a.min_inputs > 0) {
        rejected({ins.begin(), ins.end() - 1}, outs,
                 "needs at least " + plural(a.min_inputs, "input") + ", has " + std::to_string(a.min_inputs - 1));
      }
      if (const int k = last_strict(ins); k >= 0) {
        std::vector<bool> absent = ins;
        absent[static_cast<size_t>(k)] = false;
        rejected(absent, outs, "input " + std::to_string(k) + " is required");
      }
      if (a.max_inputs != kVariadic) {
        rejected(std::vector<bool>(static_cast<size_t>(a.max_inputs) + 1, true), outs,
                 (a.max_inputs == 0 ? "takes no inputs" : "takes at most " + plural(a.max_inputs, "input")) +
                     ", has " + std::to_string(a.max_inputs + 1));
      }
      if (a.min_outputs > 0) {
        rejected(ins, {}, "needs at least " + plural(a.min_outputs, "output") + ", has 0");
      }
      if (const int k = last_strict(outs); k >= 0) {
        std::vector<bool> absent = outs;
        absent[static_cast<size_t>(k)] = false;
        rejected(ins, absent, "output " + std::to_string(k) + " is required");
      }
      if (a.max_outputs != kVariadic) {
        rejected(ins, std::vector<bool>(static_cast<size_t>(a.max_outputs) + 1, true),
                 "takes at most " + plural(a.max_outputs, "output") + ", has " + std::to_string(a.max_outputs + 1));
      }
    }
  }
  // Only the fully variadic ops (any arguments, any results) have no arity to break.
  std::vector<std::string> unchecked;
  for (const auto& [key, n] : rejections)
    if (n == 0) unchecked.push_back(key);
  EXPECT_THAT(unchecked, ::testing::UnorderedElementsAre(std::string(kOurDomain) + "::ATenOp",
                                                         std::string(kOurDomain) + "::PythonOp"));
  EXPECT_GT(checked, 1000);
}

Graph with_node(const std::string& op, int n_in, int n_out, int64_t opset = 20) {
  return one_node("", op, opset, std::vector<bool>(static_cast<size_t>(n_in), true),
                  std::vector<bool>(static_cast<size_t>(n_out), true));
}

// The messages read as the brief for a fix would: node, op, expected count.
TEST(OpArity, MessagesNameNodeOpAndCount) {
  Graph g = with_node("MatMul", 1, 1);
  g.nodes[0].name = "MatMul_3";
  EXPECT_EQ(verify_error(g), "node MatMul (node MatMul_3): needs at least 2 inputs, has 1");
  EXPECT_THAT(verify_error(with_node("Gemm", 5, 1)), HasSubstr("Gemm (node n): takes at most 3 inputs, has 5"));
  EXPECT_THAT(verify_error(with_node("Constant", 1, 1)), HasSubstr("Constant (node n): takes no inputs, has 1"));
  EXPECT_THAT(verify_error(one_node("", "Cast", 20, {false}, {true})), HasSubstr("Cast (node n): input 0 is required"));
  EXPECT_THAT(verify_error(one_node("", "Relu", 20, {true}, {false})), HasSubstr("Relu (node n): output 0 is required"));
  EXPECT_THAT(verify_error(one_node(kOurDomain, "ReluGrad", 1, {true}, {true})),
              HasSubstr("com.torch_ort::ReluGrad (node n): needs at least 2 inputs, has 1"));
}

// The fuzzer's finds: a Cast with no inputs, a MaxPool with no outputs, a LayerNormalization
// without X reached shape rules, the attention matcher and gradient rules; verify() stops them.
TEST(OpArity, FuzzerShapedNodesAreRejected) {
  EXPECT_THAT(verify_error(with_node("Cast", 0, 1)), HasSubstr("Cast (node n): needs at least 1 input, has 0"));
  EXPECT_THAT(verify_error(with_node("MaxPool", 1, 0)), HasSubstr("MaxPool (node n): needs at least 1 output"));
  EXPECT_THAT(verify_error(one_node("", "LayerNormalization", 20, {false, true}, {true})),
              HasSubstr("input 0 is required"));
  EXPECT_THAT(verify_error(with_node("TopK", 2, 1)), HasSubstr("TopK (node n): needs at least 2 outputs, has 1"));
}

// Where a schema changed, the form of the graph's opset or of any later one is accepted: the
// core's gradient rules emit Unsqueeze(x, axes) and Gemm(a, b) into graphs of any opset.
TEST(OpArity, FollowsTheGraphsOpset) {
  EXPECT_NO_THROW(verify(with_node("Slice", 1, 1, 9)));  // starts/ends were attributes
  EXPECT_NO_THROW(verify(with_node("Slice", 5, 1, 9)));  // the opset-10 form
  EXPECT_THAT(verify_error(with_node("Slice", 1, 1, 10)), HasSubstr("needs at least 3 inputs, has 1"));
  EXPECT_THAT(verify_error(with_node("Slice", 6, 1, 13)), HasSubstr("takes at most 5 inputs, has 6"));
  EXPECT_NO_THROW(verify(with_node("Unsqueeze", 1, 1, 11)));
  EXPECT_NO_THROW(verify(with_node("Unsqueeze", 2, 1, 11)));
  EXPECT_THAT(verify_error(with_node("Unsqueeze", 1, 1, 13)), HasSubstr("needs at least 2 inputs, has 1"));
  EXPECT_NO_THROW(verify(with_node("Gemm", 2, 1, 9)));  // C became optional in 11
  EXPECT_NO_THROW(verify(with_node("Clip", 3, 1, 13)));
  EXPECT_NO_THROW(verify(with_node("Pad", 4, 1, 18)));
  EXPECT_NO_THROW(verify(with_node("Pad", 1, 1, 10)));
  EXPECT_THAT(verify_error(with_node("Pad", 1, 1, 11)), HasSubstr("needs at least 2 inputs, has 1"));
  EXPECT_THAT(verify_error(with_node("Pad", 5, 1, 13)), HasSubstr("takes at most 4 inputs, has 5"));
  EXPECT_THAT(verify_error(with_node("BatchNormalization", 5, 5, 15)), HasSubstr("takes at most 3 outputs, has 5"));
  EXPECT_NO_THROW(verify(with_node("BatchNormalization", 5, 5, 9)));
  // Opset before the op existed: its first form. No import of the domain: opset 20.
  EXPECT_NO_THROW(verify(with_node("Gelu", 1, 1, 13)));
  Graph none = with_node("Slice", 1, 1, 9);
  none.opset_imports.clear();
  EXPECT_THAT(verify_error(none), HasSubstr("needs at least 3 inputs"));
}

TEST(OpArity, OptionalSlotsAndDomains) {
  // Omitted optional inputs/outputs inside the allowed range are fine.
  EXPECT_NO_THROW(verify(one_node("", "Clip", 20, {true, false, true}, {true})));
  EXPECT_NO_THROW(verify(one_node("", "Dropout", 20, {true, false, true}, {true, false})));
  EXPECT_NO_THROW(verify(one_node("", "LayerNormalization", 20, {true, true}, {true, false, true})));
  // AttentionGrad keeps dY's slot when only dLogSumExp flows, and a slot per input gradient.
  EXPECT_NO_THROW(verify(one_node(kOurDomain, "AttentionGrad", 1, {false, true, true, true, true, true},
                                  {false, true, false})));
  EXPECT_THAT(verify_error(one_node(kOurDomain, "AttentionGrad", 1, {true, false, true, true, true, true},
                                    {true, true, true})),
              HasSubstr("input 1 is required"));
  // The importer writes ONNX's default domain as ""; a graph spelling it out is refused, so no
  // stage takes a standard op for one of another domain. Ops the table does not know are not checked.
  EXPECT_THAT(verify_error(one_node("ai.onnx", "MatMul", 20, {true, true}, {true})),
              HasSubstr("domain 'ai.onnx' must be written \"\""));
  EXPECT_NO_THROW(verify(one_node("com.example", "MatMul", 1, {}, {})));
  EXPECT_NO_THROW(verify(one_node("", "NoSuchOp", 20, {}, {})));
  EXPECT_FALSE(find_op_arity("", "NoSuchOp", 20));
}

}  // namespace
}  // namespace torch_ort
