// Declarative local rewrites: a rule is a pattern (a tree of node patterns rooted at the node to
// replace), a condition over what it matched, and a builder of the node that takes the root's
// place. The interior nodes of the tree go away. One scan over the nodes, in order, applies the
// first rule whose pattern and condition hold at each node; a node a rewrite removed is never
// matched again in the same scan.
//
//   Rule{"MatMul + bias -> FusedMatMul",
//        op("Add").commutative().in({from(op("MatMul").as("mm").in({val("x"), val("w")}), "y"), val("bias")}),
//        [](const Graph& g, const Match& m) { return is_row_bias(g, m.value("bias"), m.value("y")); },
//        [](Graph& g, const Match& m, const Node& root) { return Node{...}; }}
//
// Patterns are trees: a value read twice inside one match (a diamond) is expressed by capturing
// it under the same name twice, which then must be the same value; `inside` takes in the producer
// of such a value. Beyond trees: a product of any association and operand order (`product`), a
// choice between inputs (`one_of`), a scalar constant of a given value (`num`), one node that
// reads the root's output (`read_by`, e.g. the LayerNormalization after a residual Add), and every
// node that reads it (`read_by_all`, a sequence and the SequenceAt nodes that take it apart).
//
// Whatever a rule says, a rewrite is applied only when it keeps the graph whole: every value a
// removed node made that is read outside the match (or is a graph output) is made by the new
// node, the new node's inputs exist where it runs (the root's position), and its outputs are read
// only after it. A rule whose rewrite would break one of these is skipped at that node.
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
  const std::vector<NodeId>& readers(ValueId v) const;  // every node reading v in the graph
  const GraphIndex& index() const { return *index_; }   // the graph's, as the scan began
  bool has(const std::string& name) const;               // a node or value captured under this name

 private:
  friend class Matcher;
  const GraphIndex* index_ = nullptr;
  std::map<std::string, NodeId> nodes_;
  std::map<std::string, ValueId> values_;
  std::vector<NodeId> interior_;
  std::vector<ValueId> inside_;  // values whose readers must all be in the match
};

struct NodePattern;

// One input position of a node pattern (or one factor of a product).
struct Input {
  enum class Kind { kValue, kProducer, kInside, kSees, kNumber, kOneOf };
  Kind kind = Kind::kValue;
  std::string capture;                     // the value's name in the Match ("" = not captured)
  bool optional = false;                   // may be absent (omitted, or past the node's inputs)
  std::shared_ptr<NodePattern> producer;   // kProducer, kInside, kSees: the pattern of the value's maker
  std::vector<Input> alternatives;         // kOneOf: tried in order
  double number = 0.0, rtol = 0.0;         // kNumber: the constant's value, its relative tolerance
};

struct NodePattern {
  std::function<bool(const Graph&, const Node&)> accepts;
  std::string capture;          // the node's name in the Match ("" = not captured)
  std::vector<Input> inputs;    // checked position by position (a product: its factors, any order)
  bool any_arity = false;       // more inputs than listed are allowed (the rest are not looked at)
  bool swap = false;            // two inputs: either order
  int outputs = -1;             // required number of outputs (-1: any)
  bool product = false;         // a tree of two-input Muls, see product()
  double constant = 1.0, rtol = 0.0;  // product: its constant factor, within rtol
  // tree(): which nodes the tree takes in (given the root), and how many at most.
  std::function<bool(const Graph&, const Node& member, const Node& root)> member;
  size_t max_nodes = 0;
  std::shared_ptr<NodePattern> reader;  // the root only: see read_by() and read_by_all()
  std::string root_output;
  bool all_readers = false;

  NodePattern& as(std::string name) { capture = std::move(name); return *this; }
  NodePattern& in(std::vector<Input> ins) { inputs = std::move(ins); return *this; }
  NodePattern& commutative() { swap = true; return *this; }
  NodePattern& at_least_these_inputs() { any_arity = true; return *this; }
  NodePattern& with_outputs(int n) { outputs = n; return *this; }
  // The root only: a node reading the root's output 0 (captured as `output`) and matching `p`
  // goes with the match. The new node still takes the root's place, so its inputs must exist there.
  NodePattern& read_by(std::string output, NodePattern p) {
    root_output = std::move(output);
    reader = std::make_shared<NodePattern>(std::move(p));
    return *this;
  }
  // The root only: every node reading the root's output 0 (at least one; the output is no graph
  // output) matches `p`, which captures nothing, and all of them go with the match. The builder
  // finds them as m.readers(m.value(output)); what it makes runs at the root's place.
  NodePattern& read_by_all(std::string output, NodePattern p) {
    read_by(std::move(output), std::move(p));
    all_readers = true;
    return *this;
  }
};

// Node patterns: an ONNX-domain op (domain ""), an op of our domain, any node satisfying
// a predicate (an op family, a trait, attribute checks).
NodePattern op(std::string op_type);
NodePattern ours(std::string op_type);
NodePattern where(std::function<bool(const Graph&, const Node&)> accepts);
// A product: a two-input Mul and the Muls below it that only the tree reads (any association,
// any operand order). Its scalar float constants multiply to `constant` (within the relative
// tolerance `rtol`); its other leaves match `factors`, one each, in some order.
NodePattern product(std::vector<Input> factors, double constant, double rtol = 0.0);
// The largest tree of nodes rooted here that `member` accepts (the root included), grown from the
// root towards the inputs, breadth first, through values only the tree reads, up to `max_nodes`.
// Its nodes other than the root are the match's interior, in the order they were taken.
NodePattern tree(std::function<bool(const Graph&, const Node& member, const Node& root)> member, size_t max_nodes);

// Inputs: any present value; an optional one; a value some node matching `p` produces (as its
// only reader, and no graph output) — the producer becomes an interior node of the match.
Input val(std::string capture);
Input opt(std::string capture);
Input from(NodePattern p, std::string capture = "");
// As `from`, for a value read more than once inside the match: every reader must be in it.
Input inside(NodePattern p, std::string capture);
// A value made by a node matching `p`, only looked at: that node and what it reads stay in the
// graph whoever else reads them (a causal mask every layer shares).
Input sees(NodePattern p, std::string capture = "");
// A scalar float constant (an initializer or a Constant node) within `rtol` of `value`.
Input num(double value, double rtol = 0.0);
// The first of these that leads to a whole match (the value captured as `capture`).
Input one_of(std::vector<Input> alternatives, std::string capture = "");

// v is read by `reader` only (and is no graph output), in the graph as the scan began.
bool only_read_by(const Graph& g, const Match& m, ValueId v, NodeId reader);

// What a builder makes: the node that takes the root's place, nodes that run just before it (a
// Flatten of an input the new node reads) and nodes that run just after it (reading its outputs);
// a Node converts to one without those.
struct Replacement {
  Node node;
  std::vector<Node> before, after;
  Replacement(Node n, std::vector<Node> b = {}, std::vector<Node> a = {})  // NOLINT: implicit
      : node(std::move(n)), before(std::move(b)), after(std::move(a)) {}
};

struct Rule {
  std::string name;  // what it does, for reading and for test failures
  NodePattern root;
  std::function<bool(const Graph&, const Match&)> condition;  // empty: always
  // The node that replaces the root (its domain, op, inputs, outputs, attributes; the name and
  // the training-graph phase of the root are kept when the builder leaves them empty/false). It
  // may add values to the graph (a new output) and nodes before and after the new one.
  std::function<Replacement(Graph&, const Match&, const Node& root)> build;
};

// Applies the rules in one scan (see the header comment); returns whether anything changed. The
// scan runs from the first node to the last, or from the last to the first (a rule whose match
// grows towards the inputs, as tree() does, then takes the largest one at the last node).
enum class Scan { kFirstToLast, kLastToFirst };
bool apply(Graph& g, const std::vector<Rule>& rules, Scan order = Scan::kFirstToLast);

}  // namespace torch_ort::rewrite
