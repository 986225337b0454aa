// Verifier and topological sort tests: each broken invariant yields a VerifyError naming the node.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/verifier.h"
#include "ir_builders.h"

namespace torch_ort {
namespace {

using ::testing::HasSubstr;
using testing::add_node;
using testing::fvalue;

// x -> Relu(/a) -> a -> Neg(/b) -> b (graph output); w is an initializer read by /b2.
struct Chain {
  Graph g;
  ValueId x, a, b, w, c;
  Chain() {
    x = fvalue(g, "x");
    a = fvalue(g, "a");
    b = fvalue(g, "b");
    w = g.add_value("w", DType::kFloat, Shape::of({Dim::known(4)}));
    c = fvalue(g, "c");
    g.inputs = {x};
    g.initializers[w] = TensorData{DType::kFloat, {4}, std::string(16, '\0')};
    add_node(g, "Relu", {x}, {a}, "/a");
    add_node(g, "Neg", {a}, {b}, "/b");
    add_node(g, "Add", {b, w}, {c}, "/b2");
    g.outputs = {c};
  }
};

std::string verify_error(const Graph& g) {
  try {
    verify(g);
  } catch (const VerifyError& e) {
    return e.what();
  }
  ADD_FAILURE() << "verify() accepted a broken graph";
  return "";
}

TEST(Verifier, AcceptsValidGraphWithOmittedInputs) {
  Chain c;
  add_node(c.g, "Clip", {c.b, kNoValue, c.w}, {c.g.new_value("clipped", DType::kFloat, {})}, "/clip");
  EXPECT_NO_THROW(verify(c.g));
}

TEST(Verifier, UseBeforeDefinitionNamesNodeAndLateProducer) {
  Chain c;
  std::swap(c.g.nodes[0], c.g.nodes[1]);  // /b reads a before /a produces it
  const std::string e = verify_error(c.g);
  EXPECT_THAT(e, HasSubstr("Neg (node /b)"));
  EXPECT_THAT(e, HasSubstr("'a'"));
  EXPECT_THAT(e, HasSubstr("produced later by node Relu (node /a)"));
}

TEST(Verifier, ReadOfValueNobodyDefines) {
  Chain c;
  const ValueId ghost = fvalue(c.g, "ghost");
  c.g.nodes[1].inputs = {ghost};
  const std::string e = verify_error(c.g);
  EXPECT_THAT(e, HasSubstr("/b"));
  EXPECT_THAT(e, HasSubstr("'ghost'"));
}

TEST(Verifier, DuplicateDefinitionBreaksSsa) {
  Chain c;
  add_node(c.g, "Relu", {c.x}, {c.a}, "/a_again");
  const std::string e = verify_error(c.g);
  EXPECT_THAT(e, HasSubstr("'a'"));
  EXPECT_THAT(e, HasSubstr("produced twice"));
  EXPECT_THAT(e, HasSubstr("/a_again"));
  EXPECT_THAT(e, HasSubstr("Relu (node /a)"));
}

TEST(Verifier, NodeMayNotRedefineGraphInputOrInitializer) {
  Chain c;
  add_node(c.g, "Relu", {c.a}, {c.x}, "/clobber");
  EXPECT_THAT(verify_error(c.g), HasSubstr("/clobber"));
  Chain d;
  d.g.nodes[0].outputs = {d.w};
  const std::string e = verify_error(d.g);
  EXPECT_THAT(e, HasSubstr("/a"));
  EXPECT_THAT(e, HasSubstr("initializer"));
}

TEST(Verifier, UndefinedGraphOutput) {
  Chain c;
  c.g.outputs.push_back(fvalue(c.g, "dangling"));
  const std::string e = verify_error(c.g);
  EXPECT_THAT(e, HasSubstr("graph output 'dangling'"));
}

TEST(Verifier, UndefinedDtypeNamesProducingNode) {
  Chain c;
  c.g.value(c.b).dtype = DType::kUndefined;
  const std::string e = verify_error(c.g);
  EXPECT_THAT(e, HasSubstr("'b'"));
  EXPECT_THAT(e, HasSubstr("Neg (node /b)"));
  EXPECT_THAT(e, HasSubstr("no dtype"));
}

TEST(Verifier, EmptyOpTypeAndBadIds) {
  Chain c;
  c.g.nodes[1].op_type.clear();
  EXPECT_THAT(verify_error(c.g), HasSubstr("/b"));
  Chain d;
  d.g.nodes[1].inputs = {999};
  EXPECT_THAT(verify_error(d.g), HasSubstr("/b"));
}

TEST(Verifier, InputAndInitializerAtOnceIsRejected) {
  Chain c;
  c.g.inputs.push_back(c.w);
  EXPECT_THAT(verify_error(c.g), HasSubstr("'w' is both a graph input and an initializer"));
}

TEST(Verifier, InitializerDataMustMatchValue) {
  Chain c;
  c.g.initializers[c.w].raw.resize(12);
  EXPECT_THAT(verify_error(c.g), HasSubstr("initializer 'w'"));
}

TEST(TopologicalSort, KeepsValidOrderAndFixesBrokenOne) {
  Chain c;
  const ValueId side = fvalue(c.g, "side");
  add_node(c.g, "Relu", {c.x}, {side}, "/independent");  // could run first; stays last
  Graph sorted = c.g;
  topological_sort(sorted);
  ASSERT_EQ(sorted.nodes.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(sorted.nodes[i].name, c.g.nodes[i].name);

  std::reverse(c.g.nodes.begin(), c.g.nodes.end());  // /independent, /b2, /b, /a
  topological_sort(c.g);
  std::vector<std::string> names;
  for (const Node& n : c.g.nodes) names.push_back(n.name);
  EXPECT_EQ(names, (std::vector<std::string>{"/independent", "/a", "/b", "/b2"}));
  EXPECT_NO_THROW(verify(c.g));
}

TEST(TopologicalSort, CycleNamesANodeOnIt) {
  Chain c;
  c.g.nodes[0].inputs = {c.b};  // /a reads b, which /b computes from a
  try {
    topological_sort(c.g);
    FAIL() << "expected a VerifyError";
  } catch (const VerifyError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cycle"));
    EXPECT_THAT(e.what(), HasSubstr("Relu (node /a)"));
    EXPECT_THAT(e.what(), HasSubstr("Neg (node /b)"));
  }
}

TEST(TopologicalSort, SelfLoop) {
  Chain c;
  c.g.nodes[2].inputs = {c.c, c.w};
  try {
    topological_sort(c.g);
    FAIL() << "expected a VerifyError";
  } catch (const VerifyError& e) {
    EXPECT_THAT(e.what(), HasSubstr("/b2"));
  }
}

}  // namespace
}  // namespace torch_ort

namespace torch_ort {
namespace {

// Found by fuzzing: Concat's gradient rule, a shape rule and the attention matcher read 'axis'
// with get_int and threw a bare std::invalid_argument for axis=[1] or axis="x". Every attribute
// the core reads has one kind; the verifier (and the importer) say which node breaks it.
TEST(Verifier, AttributeOfTheWrongKindNamesNodeAndAttribute) {
  Chain c;
  c.g.nodes[1].attrs.set("axis", std::vector<int64_t>{1});
  EXPECT_THAT(verify_error(c.g), HasSubstr("node Neg (node /b): attribute 'axis' is of kind ints, expected int"));
  c.g.nodes[1].attrs.set("axis", int64_t{1});
  c.g.nodes[1].attrs.set("perm", std::string("0"));
  EXPECT_THAT(verify_error(c.g), HasSubstr("attribute 'perm' is of kind string, expected ints"));
  c.g.nodes[1].attrs.set("perm", std::vector<int64_t>{0});
  c.g.nodes[1].attrs.set("my_own", 1.5f);  // names the core never reads are not checked
  EXPECT_NO_THROW(verify(c.g));
}

// Cast's `to` is its output's element type: absent, or a code dtype.h does not know, is refused
// before type inference would make a value of that "type".
TEST(Verifier, CastNeedsAKnownTo) {
  Chain c;
  c.g.nodes[1].op_type = "Cast";
  EXPECT_THAT(verify_error(c.g), HasSubstr("node Cast (node /b): attribute 'to' is required"));
  c.g.nodes[1].attrs.set("to", int64_t{999});
  EXPECT_THAT(verify_error(c.g), HasSubstr("attribute 'to' is 999, not an element type"));
  c.g.nodes[1].attrs.set("to", int64_t{1} << 32 | 1);  // would be kFloat if truncated to int32
  EXPECT_THAT(verify_error(c.g), HasSubstr("attribute 'to' is 4294967297"));
  c.g.nodes[1].attrs.set("to", int64_t{0});
  EXPECT_THAT(verify_error(c.g), HasSubstr("attribute 'to' is 0"));
  c.g.nodes[1].attrs.set("to", static_cast<int64_t>(DType::kFloat));
  EXPECT_NO_THROW(verify(c.g));
}

TEST(Verifier, OpaqueOpsKeepTheirArgumentKinds) {
  // An ATenOp's arguments are named after the ATen schema ('alpha' may be an int there).
  Chain c;
  c.g.nodes[1].domain = kOurDomain;
  c.g.nodes[1].op_type = "ATenOp";
  c.g.nodes[1].attrs.set("alpha", int64_t{2});
  EXPECT_NO_THROW(verify(c.g));
  c.g.nodes[1].attrs.set("num_results", 1.0f);
  EXPECT_THAT(verify_error(c.g), HasSubstr("attribute 'num_results' is of kind float, expected int"));
}

}  // namespace
}  // namespace torch_ort
