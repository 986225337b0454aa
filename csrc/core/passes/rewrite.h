// Declarative local rewrites: a rule is a pattern (a tree of node patterns rooted at the node to
// replace), a condition over what it matched, and a builder of the node that takes the root's
// place. The interior nodes of the tree (each read only by its parent) go away. One scan over the
// nodes, in order, applies the first rule whose pattern and condition hold at each node; a node
// a rewrite removed is never matched again in the same scan.
//
//   Rule{"MatMul + bias -> FusedMatMul",
//        op("Add").commutative().in({from(op("MatMul").as("mm").in({val("x"), val("w")}), "y"), val("bias")}),
//        [](const Graph& g, const Match& m) { return is_row_bias(g, m.value("bias"), m.value("y")); },
//        [](const Graph& g, const Match& m, const Node& root) { return Node{...}; }}
//
// Patterns are trees: a value read twice inside one match (a diamond) is expressed by capturing
// it under the same name twice, which then must be the same value.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "csrc/core/ir/graph.h"

namespace torch_ort::rewrite {

// What a pattern matched: nodes and values by their capture names.
class Match {
 public:
  NodeId node(const std::string& name) const;    // throws std::out_of_range for an unknown name
  ValueId value(const std::string& name) const;  // kNoValue for an absent optional input
  const std::vector<NodeId>& interior() const { return interior_; }  // nodes the rewrite removes

 private:
  friend class Matcher;
  std::map<std::string, NodeId> nodes_;
  std::map<std::string, ValueId> values_;
  std::vector<NodeId> interior_;
};

struct NodePattern;

// One input position of a node pattern.
struct Input {
  std::string capture;                     // the value's name in the Match ("" = not captured)
  bool optional = false;                   // may be absent (omitted, or past the node's inputs)
  std::shared_ptr<NodePattern> producer;   // set: produced by a node matching this, read only here
};

struct NodePattern {
  std::function<bool(const Graph&, const Node&)> accepts;
  std::string capture;          // the node's name in the Match ("" = not captured)
  std::vector<Input> inputs;    // checked position by position
  bool any_arity = false;       // more inputs than listed are allowed (the rest are not looked at)
  bool swap = false;            // two inputs: either order
  int outputs = -1;             // required number of outputs (-1: any)

  NodePattern& as(std::string name) { capture = std::move(name); return *this; }
  NodePattern& in(std::vector<Input> ins) { inputs = std::move(ins); return *this; }
  NodePattern& commutative() { swap = true; return *this; }
  NodePattern& at_least_these_inputs() { any_arity = true; return *this; }
  NodePattern& with_outputs(int n) { outputs = n; return *this; }
};

// Node patterns: an ONNX-domain op (domain ""), an op of our domain, any node satisfying
// a predicate (an op family, a trait, attribute checks).
NodePattern op(std::string op_type);
NodePattern ours(std::string op_type);
NodePattern where(std::function<bool(const Graph&, const Node&)> accepts);

// Inputs: any present value; an optional one; a value some node matching `p` produces (as its
// only reader, and no graph output) — the producer becomes an interior node of the match.
Input val(std::string capture);
Input opt(std::string capture);
Input from(NodePattern p, std::string capture = "");

struct Rule {
  std::string name;  // what it does, for reading and for test failures
  NodePattern root;
  std::function<bool(const Graph&, const Match&)> condition;  // empty: always
  // The node that replaces the root (its domain, op, inputs, outputs, attributes; the name and
  // the training-graph phase of the root are kept when the builder leaves them empty/false).
  std::function<Node(const Graph&, const Match&, const Node& root)> build;
};

// Applies the rules in one scan (see the header comment); returns whether anything changed.
bool apply(Graph& g, const std::vector<Rule>& rules);

}  // namespace torch_ort::rewrite
