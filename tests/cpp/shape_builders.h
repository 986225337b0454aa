// Helpers for shape-inference tests: shapes as strings ("[batch,4]"), tiny graphs, one-op runs.
#pragma once

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "csrc/core/ir/graph.h"
#include "csrc/core/shapes/infer_shapes.h"

namespace torch_ort::testing {

// "[batch,4,?]" -> symbolic, known, unknown dims; "[?]" -> unknown rank; "[]" -> scalar.
inline Shape S(const std::string& text) {
  if (text == "[?]") return Shape::unknown();
  Shape s = Shape::of({});
  std::string body = text.substr(1, text.size() - 2), item;
  std::stringstream in(body);
  while (std::getline(in, item, ',')) {
    if (item == "?") s.dims.push_back(Dim{});
    else if (item.find_first_not_of("0123456789") == std::string::npos) s.dims.push_back(Dim::known(std::stoll(item)));
    else s.dims.push_back(Dim::symbolic(item));
  }
  return s;
}

// A graph grown one node at a time; node outputs start with unknown shapes unless given.
struct GraphBuilder {
  Graph g;

  ValueId input(const std::string& name, const std::string& shape, DType dt = DType::kFloat) {
    ValueId v = g.add_value(name, dt, S(shape));
    g.inputs.push_back(v);
    return v;
  }
  ValueId ints(const std::vector<int64_t>& v, bool scalar = false) {  // an int64 initializer
    TensorData t = TensorData::from_int64s(v, scalar);
    Shape s = Shape::of({});
    for (int64_t d : t.dims) s.dims.push_back(Dim::known(d));
    ValueId id = g.new_value("const", DType::kInt64, s);
    g.initializers[id] = std::move(t);
    return id;
  }
  // Appends a node; returns its outputs (shapes unknown unless `held` gives one per output).
  // Outputs take the first input's dtype (int64 for Shape/Size), so shape chains stay integer.
  std::vector<ValueId> node(const std::string& op, std::vector<ValueId> ins, Attributes attrs = {},
                            int n_out = 1, const std::string& domain = "",
                            std::vector<std::string> held = {}) {
    DType dt = op == "Shape" || op == "Size" ? DType::kInt64 : DType::kFloat;
    if (op != "Shape" && op != "Size" && !ins.empty() && ins[0] != kNoValue) dt = g.value(ins[0]).dtype;
    std::vector<ValueId> outs;
    for (int k = 0; k < n_out; ++k)
      outs.push_back(g.new_value(op + "_out", dt, k < static_cast<int>(held.size()) ? S(held[k]) : Shape::unknown()));
    g.nodes.push_back(Node{domain, op, g.unique_node_name("/" + op), std::move(ins), outs, std::move(attrs)});
    return outs;
  }
  ValueId op(const std::string& op_type, std::vector<ValueId> ins, Attributes attrs = {}) {
    return node(op_type, std::move(ins), std::move(attrs))[0];
  }
  std::string shape(ValueId v) const { return g.value(v).shape.to_string(); }
};

// An input of a one-op test: a tensor of some shape, an int64 constant, or an omitted input.
struct In {
  std::string shape;                           // for tensors
  std::optional<std::vector<int64_t>> values;  // int64 constant (an initializer)
  bool scalar = false;
  bool absent = false;
  DType dtype = DType::kFloat;
};
inline In T(const std::string& shape, DType dt = DType::kFloat) { return In{shape, std::nullopt, false, false, dt}; }
inline In C(std::vector<int64_t> v, bool scalar = false) { return In{"", std::move(v), scalar, false, DType::kInt64}; }
inline In Absent() { return In{"", std::nullopt, false, true}; }

// Output shapes (as strings) of one `op` node after infer_shapes.
inline std::vector<std::string> infer_all(const std::string& op, const std::vector<In>& ins,
                                          Attributes attrs = {}, int n_out = 1,
                                          const std::string& domain = "", int64_t opset = 20) {
  GraphBuilder b;
  b.g.opset_imports[""] = opset;
  std::vector<ValueId> ids;
  for (size_t i = 0; i < ins.size(); ++i) {
    if (ins[i].absent) ids.push_back(kNoValue);
    else if (ins[i].values) ids.push_back(b.ints(*ins[i].values, ins[i].scalar));
    else ids.push_back(b.input("in" + std::to_string(i), ins[i].shape, ins[i].dtype));
  }
  std::vector<ValueId> outs = b.node(op, ids, std::move(attrs), n_out, domain);
  infer_shapes(b.g);
  std::vector<std::string> out;
  for (ValueId v : outs) out.push_back(b.shape(v));
  return out;
}
inline std::string infer1(const std::string& op, const std::vector<In>& ins, Attributes attrs = {},
                          const std::string& domain = "", int64_t opset = 20) {
  return infer_all(op, ins, std::move(attrs), 1, domain, opset)[0];
}

// Attributes in one expression: A({{"axis", int64_t{1}}, {"perm", std::vector<int64_t>{1, 0}}}).
inline Attributes A(std::initializer_list<std::pair<std::string, Attribute>> kv) {
  Attributes a;
  for (const auto& [k, v] : kv) a.set(k, v);
  return a;
}

}  // namespace torch_ort::testing
