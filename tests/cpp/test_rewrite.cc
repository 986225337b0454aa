// The declarative rewrite vocabulary (passes/rewrite.h): what a pattern matches, the choices it
// backtracks over, and what a rewrite keeps and removes.
#include <gtest/gtest.h>

#include <algorithm>

#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/rewrite.h"
#include "tests/cpp/ir_builders.h"

namespace torch_ort {
namespace {

using namespace rewrite;
using testing::add_node;
using testing::fvalue;

// y = Relu(Neg(a)) + b, with a, b graph inputs of shape [batch, 4].
struct Chain {
  Graph g;
  ValueId a, b, n, r, y;
};
Chain chain() {
  Chain c;
  c.a = fvalue(c.g, "a");
  c.b = fvalue(c.g, "b");
  c.g.inputs = {c.a, c.b};
  c.n = fvalue(c.g, "n");
  c.r = fvalue(c.g, "r");
  c.y = fvalue(c.g, "y");
  add_node(c.g, "Neg", {c.a}, {c.n}, "/neg");
  add_node(c.g, "Relu", {c.n}, {c.r}, "/relu");
  add_node(c.g, "Add", {c.r, c.b}, {c.y}, "/add");
  c.g.outputs = {c.y};
  return c;
}

// Relu(Neg(x)) + other -> Sub(other, x)... a nonsense rewrite whose structure is easy to check.
Rule add_of_relu_of_neg(std::function<bool(const Graph&, const Match&)> condition = {}) {
  return Rule{"Add(Relu(Neg(x)), other) -> Sub(other, x)",
              op("Add").commutative().in({from(op("Relu").as("relu").in({from(op("Neg").in({val("x")}))})),
                                          val("other")}),
              std::move(condition),
              [](const Graph&, const Match& m, const Node& root) {
                return Node{"", "Sub", "", {m.value("other"), m.value("x")}, root.outputs, {}};
              }};
}

TEST(Rewrite, TreeMatchReplacesTheRootAndRemovesTheInterior) {
  Chain c = chain();
  c.g.nodes[2].in_backward = true;  // the root's phase is kept
  ASSERT_TRUE(apply(c.g, {add_of_relu_of_neg()}));
  verify(c.g);
  ASSERT_EQ(c.g.nodes.size(), 1u);
  const Node& n = c.g.nodes[0];
  EXPECT_EQ(n.op_type, "Sub");
  EXPECT_EQ(n.name, "/add");  // an empty builder name keeps the root's
  EXPECT_TRUE(n.in_backward);
  EXPECT_EQ(n.inputs, (std::vector<ValueId>{c.b, c.a}));
  EXPECT_EQ(n.outputs, (std::vector<ValueId>{c.y}));
}

TEST(Rewrite, CommutativeRootTriesTheOtherOrderWhenTheConditionFails) {
  // y = Relu(Neg(a)) + Relu(Neg(c)): both orders match; the condition accepts only x = c.
  Chain ch = chain();
  Graph& g = ch.g;
  const ValueId c = fvalue(g, "c"), nc = fvalue(g, "nc"), rc = fvalue(g, "rc");
  g.inputs = {ch.a, c};
  add_node(g, "Neg", {c}, {nc}, "/neg_c");
  add_node(g, "Relu", {nc}, {rc}, "/relu_c");
  std::rotate(g.nodes.begin() + 2, g.nodes.begin() + 3, g.nodes.end());  // the Add last
  g.nodes.back().inputs = {ch.r, rc};
  std::vector<ValueId> tried;
  ASSERT_TRUE(apply(g, {add_of_relu_of_neg([&](const Graph&, const Match& m) {
    tried.push_back(m.value("x"));
    return m.value("x") == c;
  })}));
  EXPECT_EQ(tried, (std::vector<ValueId>{ch.a, c}));
  verify(g);
  // The matched side's Relu and Neg went; the other side's stay, read by the Sub.
  ASSERT_EQ(g.nodes.size(), 3u);
  EXPECT_EQ(g.nodes.back().op_type, "Sub");
  EXPECT_EQ(g.nodes.back().inputs, (std::vector<ValueId>{ch.r, c}));
}

TEST(Rewrite, AConditionThatNeverHoldsChangesNothing) {
  Chain ch = chain();
  int tried = 0;
  EXPECT_FALSE(apply(ch.g, {add_of_relu_of_neg([&](const Graph&, const Match&) { return ++tried, false; })}));
  EXPECT_EQ(ch.g.nodes.size(), 3u);
  EXPECT_EQ(tried, 1);  // (b, r) never reaches the condition: b is not Relu's output
}

TEST(Rewrite, AnInteriorValueReadElsewhereBlocksTheMatch) {
  Chain c = chain();
  c.g.outputs.push_back(c.n);  // Neg's output is also a graph output
  EXPECT_FALSE(apply(c.g, {add_of_relu_of_neg()}));
  Chain d = chain();
  const ValueId extra = fvalue(d.g, "extra");
  add_node(d.g, "Exp", {d.r}, {extra}, "/exp");  // Relu's output has a second reader
  d.g.outputs.push_back(extra);
  EXPECT_FALSE(apply(d.g, {add_of_relu_of_neg()}));
  EXPECT_EQ(d.g.nodes.size(), 4u);
}

TEST(Rewrite, OptionalInputsAndArity) {
  Graph g;
  const ValueId x = fvalue(g, "x"), y = fvalue(g, "y"), z = fvalue(g, "z");
  g.inputs = {x, y};
  add_node(g, "Add", {x, y}, {z}, "/add");
  g.outputs = {z};
  std::vector<ValueId> seen;
  const Rule two_plus_optional{"", op("Add").in({val("a"), val("b"), opt("c")}),
                               [&](const Graph&, const Match& m) { seen.push_back(m.value("c")); return false; },
                               [](const Graph&, const Match&, const Node& r) { return r; }};
  EXPECT_FALSE(apply(g, {two_plus_optional}));
  EXPECT_EQ(seen, (std::vector<ValueId>{kNoValue}));  // absent: kNoValue

  const Rule one_input{"", op("Add").in({val("a")}), {}, [](const Graph&, const Match&, const Node& r) { return r; }};
  EXPECT_FALSE(apply(g, {one_input}));  // two inputs where one is listed: no match
  Rule prefix = one_input;
  prefix.root.at_least_these_inputs();
  EXPECT_TRUE(apply(g, {prefix}));
}

TEST(Rewrite, TheSameCaptureNameMustBeTheSameValue) {
  Graph g;
  const ValueId x = fvalue(g, "x"), y = fvalue(g, "y"), sq = fvalue(g, "sq"), xy = fvalue(g, "xy");
  g.inputs = {x, y};
  add_node(g, "Mul", {x, x}, {sq}, "/square");
  add_node(g, "Mul", {x, y}, {xy}, "/product");
  g.outputs = {sq, xy};
  const Rule square{"Mul(a, a) -> Pow", op("Mul").in({val("a"), val("a")}), {},
                    [](const Graph&, const Match& m, const Node& r) {
                      return Node{"", "Neg", "", {m.value("a")}, r.outputs, {}};
                    }};
  ASSERT_TRUE(apply(g, {square}));
  EXPECT_EQ(g.nodes[0].op_type, "Neg");
  EXPECT_EQ(g.nodes[1].op_type, "Mul");
}

// A float scalar constant (an initializer of rank 0).
ValueId scalar(Graph& g, const std::string& name, float v) {
  const ValueId id = g.add_value(name, DType::kFloat, Shape::of({}));
  g.initializers[id] = TensorData::scalar_float(DType::kFloat, v);
  return id;
}

// Unary node `op` over the rule's captured `x`, in the root's place.
Node unary(const std::string& op, const Match& m, const Node& root) {
  return Node{"", op, "", {m.value("x")}, root.outputs, {}};
}

TEST(Rewrite, ProductMatchesAnyAssociationAndOperandOrder) {
  // (2·x)·(z·3) and x·(6·z) are both the product 6·x·z; x·(5·z) is not.
  for (const float k : {2.0f, 6.0f, 5.0f}) {
    Graph g;
    const ValueId x = fvalue(g, "x"), z = fvalue(g, "z"), q = fvalue(g, "q"), y = fvalue(g, "y");
    g.inputs = {x, z};
    ValueId p = x;
    if (k == 2.0f) {
      p = fvalue(g, "p");
      add_node(g, "Mul", {scalar(g, "two", 2), x}, {p}, "/p");
      add_node(g, "Mul", {z, scalar(g, "three", 3)}, {q}, "/q");
    } else {
      add_node(g, "Mul", {scalar(g, "k", k), z}, {q}, "/q");
    }
    add_node(g, "Mul", {p, q}, {y}, "/y");
    g.outputs = {y};
    std::vector<ValueId> seen;
    const Rule r{"6·x·z -> Neg(x)", product({val("x"), val("z")}, 6.0),
                 [&](const Graph&, const Match& m) {
                   seen.push_back(m.value("x"));
                   return m.value("x") == x;  // the factors in the other order are tried too
                 },
                 [](Graph&, const Match& m, const Node& root) { return unary("Neg", m, root); }};
    EXPECT_EQ(apply(g, {r}), k != 5.0f) << k;
    verify(g);
    if (k == 5.0f) continue;
    ASSERT_EQ(g.nodes.size(), 1u);  // the inner Muls were the tree's
    EXPECT_EQ(g.nodes[0].inputs, (std::vector<ValueId>{x}));
    EXPECT_EQ(seen.front() == x ? seen.size() : seen.size() - 1, 1u);
  }
}

TEST(Rewrite, AProductStopsAtAFactorReadElsewhere) {
  // y = (2·x)·3 with 2·x also read by an Exp: the tree is t·3, t a leaf.
  Graph g;
  const ValueId x = fvalue(g, "x"), t = fvalue(g, "t"), y = fvalue(g, "y"), e = fvalue(g, "e");
  g.inputs = {x};
  add_node(g, "Mul", {x, scalar(g, "two", 2)}, {t}, "/t");
  add_node(g, "Mul", {t, scalar(g, "three", 3)}, {y}, "/y");
  add_node(g, "Exp", {t}, {e}, "/exp");
  g.outputs = {y, e};
  auto neg = [](Graph&, const Match& m, const Node& root) { return unary("Neg", m, root); };
  EXPECT_FALSE(apply(g, {Rule{"6·x", product({val("x")}, 6.0), {}, neg}}));
  ASSERT_TRUE(apply(g, {Rule{"3·t", product({val("x")}, 3.0), {}, neg}}));
  verify(g);
  EXPECT_EQ(g.nodes.size(), 3u);
  EXPECT_EQ(g.nodes[1].op_type, "Neg");
  EXPECT_EQ(g.nodes[1].inputs, (std::vector<ValueId>{t}));
}

TEST(Rewrite, InsideTakesAValueWhoseEveryReaderIsInTheMatch) {
  // y = Neg(s) · s, s = a + b: s is read twice, both times inside the match.
  for (const bool read_elsewhere : {false, true}) {
    Graph g;
    const ValueId a = fvalue(g, "a"), b = fvalue(g, "b"), s = fvalue(g, "s"), n = fvalue(g, "n"), y = fvalue(g, "y");
    g.inputs = {a, b};
    add_node(g, "Add", {a, b}, {s}, "/s");
    add_node(g, "Neg", {s}, {n}, "/n");
    add_node(g, "Mul", {n, s}, {y}, "/y");
    g.outputs = {y};
    if (read_elsewhere) {
      const ValueId e = fvalue(g, "e");
      add_node(g, "Exp", {s}, {e}, "/exp");
      g.outputs.push_back(e);
    }
    const Rule r{"Neg(a + b)·(a + b) -> Sub(b, a)",
                 op("Mul").in({from(op("Neg").in({val("s")})), inside(op("Add").in({val("a"), val("b")}), "s")}), {},
                 [](Graph&, const Match& m, const Node& root) {
                   return Node{"", "Sub", "", {m.value("b"), m.value("a")}, root.outputs, {}};
                 }};
    EXPECT_EQ(apply(g, {r}), !read_elsewhere);
    verify(g);
    EXPECT_EQ(g.nodes.size(), read_elsewhere ? 4u : 1u);
  }
}

TEST(Rewrite, OneOfAndConstantsOfAGivenValue) {
  // Neg(x / 2) and Neg(0.5 · x) are both Neg of half of x; Neg(x / 3) is not.
  for (const std::string form : {"Div2", "Mul0.5", "Div3"}) {
    Graph g;
    const ValueId x = fvalue(g, "x"), h = fvalue(g, "h"), y = fvalue(g, "y");
    g.inputs = {x};
    if (form == "Mul0.5") {
      add_node(g, "Mul", {scalar(g, "half", 0.5f), x}, {h}, "/h");
    } else {
      add_node(g, "Div", {x, scalar(g, "d", form == "Div2" ? 2.0f : 3.0f)}, {h}, "/h");
    }
    add_node(g, "Neg", {h}, {y}, "/y");
    g.outputs = {y};
    const Rule r{"Neg(x / 2) -> Sigmoid(x)",
                 op("Neg").in({one_of({from(op("Div").in({val("x"), num(2.0)})), from(product({val("x")}, 0.5))})}),
                 {}, [](Graph&, const Match& m, const Node& root) { return unary("Sigmoid", m, root); }};
    EXPECT_EQ(apply(g, {r}), form != "Div3") << form;
    verify(g);
  }
}

// s = a + b; r = Relu(s) [; e = Exp(s)]: a rule rooted at the Add that takes the Relu with it.
struct AddThenRelu {
  Graph g;
  ValueId a, b, s, r;
  explicit AddThenRelu(bool sum_read_elsewhere) {
    a = fvalue(g, "a");
    b = fvalue(g, "b");
    s = fvalue(g, "s");
    r = fvalue(g, "r");
    g.inputs = {a, b};
    add_node(g, "Add", {a, b}, {s}, "/add");
    if (sum_read_elsewhere) {
      const ValueId e = fvalue(g, "e");
      add_node(g, "Exp", {s}, {e}, "/exp");
      g.outputs.push_back(e);
    }
    add_node(g, "Relu", {s}, {r}, "/relu");
    g.outputs.push_back(r);
  }
};

Rule add_relu(bool keep_sum) {
  NodePattern root = op("Add").in({val("a"), val("b")});
  root.read_by("s", op("Relu").as("relu").in({val("s")}));
  return Rule{"Relu(a + b) -> one node", std::move(root), {},
              [keep_sum](Graph& g, const Match& m, const Node& add) {
                std::vector<ValueId> outs{g.nodes[m.node("relu")].outputs[0]};
                if (keep_sum) outs.push_back(add.outputs[0]);
                return Node{"", "AddRelu", "", {m.value("a"), m.value("b")}, outs, {}};
              }};
}

TEST(Rewrite, AReaderOfTheRootGoesWithTheMatchAndTheNewNodeTakesTheRootsPlace) {
  AddThenRelu t(true);
  ASSERT_TRUE(apply(t.g, {add_relu(true)}));
  verify(t.g);
  ASSERT_EQ(t.g.nodes.size(), 2u);
  EXPECT_EQ(t.g.nodes[0].op_type, "AddRelu");  // at the Add's place, ahead of the Exp reading s
  EXPECT_EQ(t.g.nodes[0].name, "/add");
  EXPECT_EQ(t.g.nodes[0].outputs, (std::vector<ValueId>{t.r, t.s}));
  EXPECT_EQ(t.g.nodes[1].op_type, "Exp");
}

TEST(Rewrite, ARewriteThatWouldLoseAValueOrReadOneTooEarlyIsSkipped) {
  // The sum has another reader but the new node does not make it: skipped.
  AddThenRelu lose(true);
  EXPECT_FALSE(apply(lose.g, {add_relu(false)}));
  EXPECT_EQ(lose.g.nodes.size(), 3u);
  AddThenRelu fine(false);
  EXPECT_TRUE(apply(fine.g, {add_relu(false)}));
  verify(fine.g);

  // The reader takes a value made after the root: the new node, in the root's place, cannot.
  AddThenRelu late(false);
  Graph& g = late.g;
  const ValueId c = fvalue(g, "c"), m = fvalue(g, "m");
  add_node(g, "Neg", {late.a}, {c}, "/late");
  std::rotate(g.nodes.begin() + 1, g.nodes.begin() + 2, g.nodes.end());  // Add, Neg, Relu
  g.nodes[2] = Node{"", "Mul", "/mul", {late.s, c}, {m}, {}};
  g.outputs = {m};
  verify(g);
  NodePattern root = op("Add").in({val("a"), val("b")});
  root.read_by("s", op("Mul").as("mul").in({val("s"), val("c")}));
  const Rule takes_late{"(a + b)·c -> one node", std::move(root), {}, [](Graph& gg, const Match& mm, const Node&) {
                          return Node{"", "AddMul", "", {mm.value("a"), mm.value("b"), mm.value("c")},
                                      gg.nodes[mm.node("mul")].outputs, {}};
                        }};
  EXPECT_FALSE(apply(g, {takes_late}));
  EXPECT_EQ(g.nodes.size(), 3u);
}

// s = Exp(a), read by a Relu and a Neg (and, as asked, by a Sqrt or as a graph output); a Tanh of a
// between them.
struct ExpReadTwice {
  Graph g;
  ValueId a, s, t, r1, r2;
  explicit ExpReadTwice(bool sqrt_reads = false, bool s_is_output = false)
      : a(fvalue(g, "a")), s(fvalue(g, "s")), t(fvalue(g, "t")), r1(fvalue(g, "r1")), r2(fvalue(g, "r2")) {
    g.inputs = {a};
    add_node(g, "Exp", {a}, {s}, "/exp");
    add_node(g, "Relu", {s}, {r1}, "/relu");
    add_node(g, "Tanh", {a}, {t}, "/tanh");
    add_node(g, "Neg", {s}, {r2}, "/neg");
    g.outputs = {r1, r2, t};
    if (sqrt_reads) {
      const ValueId q = fvalue(g, "q");
      add_node(g, "Sqrt", {s}, {q}, "/sqrt");
      g.outputs.push_back(q);
    }
    if (s_is_output) g.outputs.push_back(s);
  }
};

// Exp and every reader -> Fused(a) making the Relu's value, then Mirror(Fused's output or `mirror_reads`).
Rule exp_and_readers(ValueId mirror_reads = kNoValue) {
  NodePattern readers = where([](const Graph&, const Node& n) { return n.op_type == "Relu" || n.op_type == "Neg"; });
  return Rule{"Exp and its readers -> Fused + Mirror",
              op("Exp").in({val("a")}).read_by_all("s", readers.at_least_these_inputs()), {},
              [mirror_reads](Graph& g, const Match& m, const Node&) {
                std::vector<ValueId> outs;
                for (NodeId r : m.readers(m.value("s"))) outs.push_back(g.nodes[r].outputs[0]);  // r1, r2
                const ValueId read = mirror_reads == kNoValue ? outs[0] : mirror_reads;
                return Replacement{Node{"", "Fused", "", {m.value("a")}, {outs[0]}, {}}, {},
                                   {Node{"", "Mirror", "/mirror", {read}, {outs[1]}, {}}}};
              }};
}

TEST(Rewrite, EveryReaderOfTheRootGoesWithTheMatchAndNodesAfterTheNewOneReadItsOutputs) {
  ExpReadTwice t;
  ASSERT_TRUE(apply(t.g, {exp_and_readers()}));
  verify(t.g);
  ASSERT_EQ(t.g.nodes.size(), 3u);
  EXPECT_EQ(t.g.nodes[0].op_type, "Fused");  // in the Exp's place, the Mirror just after it
  EXPECT_EQ(t.g.nodes[0].name, "/exp");
  EXPECT_EQ(t.g.nodes[1].op_type, "Mirror");
  EXPECT_EQ(t.g.nodes[1].inputs, std::vector<ValueId>{t.r1});
  EXPECT_EQ(t.g.nodes[1].outputs, std::vector<ValueId>{t.r2});
  EXPECT_EQ(t.g.nodes[2].op_type, "Tanh");

  ExpReadTwice other_reader(true), read_outside(false, true), mirror_reads_s;
  EXPECT_FALSE(apply(other_reader.g, {exp_and_readers()}));  // the Sqrt does not match
  EXPECT_FALSE(apply(read_outside.g, {exp_and_readers()}));  // s is a graph output
  // A node after the new one reading a value that went with the match (s): skipped.
  EXPECT_FALSE(apply(mirror_reads_s.g, {exp_and_readers(mirror_reads_s.s)}));
  EXPECT_EQ(mirror_reads_s.g.nodes.size(), 4u);
}

TEST(Rewrite, ANodeOnlySeenStaysWhoeverElseReadsIt) {
  // y = x + Neg(c) and e = Exp(Neg(c)): `sees` matches the shared Neg without taking it.
  Graph g;
  const ValueId x = fvalue(g, "x"), c = fvalue(g, "c"), n = fvalue(g, "n"), y = fvalue(g, "y"), e = fvalue(g, "e");
  g.inputs = {x, c};
  add_node(g, "Neg", {c}, {n}, "/neg");
  add_node(g, "Add", {x, n}, {y}, "/add");
  add_node(g, "Exp", {n}, {e}, "/exp");
  g.outputs = {y, e};
  auto sub = [](Graph&, const Match& m, const Node& root) {
    return Node{"", "Sub", "", {m.value("x"), m.value("c")}, root.outputs, {}};
  };
  EXPECT_FALSE(apply(g, {Rule{"x + Neg(c), Neg taken", op("Add").in({val("x"), from(op("Neg").in({val("c")}))}), {}, sub}}));
  ASSERT_TRUE(apply(g, {Rule{"x + Neg(c), Neg seen", op("Add").in({val("x"), sees(op("Neg").in({val("c")}))}), {}, sub}}));
  verify(g);
  ASSERT_EQ(g.nodes.size(), 3u);  // the Neg stays for the Exp
  EXPECT_EQ(g.nodes[0].op_type, "Neg");
  EXPECT_EQ(g.nodes[1].op_type, "Sub");
}

TEST(Rewrite, ATreeIsTheLargestOneEndingAtItsRootWhenTheScanStartsAtTheLast) {
  // y = Exp(Relu(Neg(a))): from the last node, one tree of three; at most two nodes, Neg stays.
  for (const size_t most : {size_t{32}, size_t{2}}) {
    Chain c = chain();
    Graph& g = c.g;
    g.nodes.back() = Node{"", "Exp", "/exp", {c.r}, {c.y}, {}};
    const std::vector<std::string> unary{"Neg", "Relu", "Exp"};
    auto member = [&](const Graph&, const Node& n, const Node&) {
      return std::find(unary.begin(), unary.end(), n.op_type) != unary.end();
    };
    std::vector<NodeId> taken;
    const Rule fuse{"unary tree -> one node", tree(member, most).as("root"),
                    [&](const Graph&, const Match& m) {
                      if (m.interior().empty()) return false;  // a tree of one node is left alone
                      taken = m.interior();
                      return true;
                    },
                    [](Graph&, const Match&, const Node& root) {
                      return Node{"", "Fused", "", {}, root.outputs, {}};
                    }};
    ASSERT_TRUE(apply(g, {fuse}, Scan::kLastToFirst));
    EXPECT_EQ(taken, most == 2 ? std::vector<NodeId>{1} : (std::vector<NodeId>{1, 0}));  // breadth first
    ASSERT_EQ(g.nodes.size(), most == 2 ? 2u : 1u);
    EXPECT_EQ(g.nodes.back().op_type, "Fused");
  }
}

TEST(Rewrite, UnknownCaptureNamesThrow) {
  Match m;
  EXPECT_THROW(m.node("nope"), std::out_of_range);
  EXPECT_THROW(m.value("nope"), std::out_of_range);
}

}  // namespace
}  // namespace torch_ort
