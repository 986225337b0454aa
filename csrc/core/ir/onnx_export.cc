// IR -> ONNX ModelProto bytes (ir_version 10), readable by onnx.checker and onnxruntime.
#include <set>

#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/onnx_io.h"
#include "torch_ort_onnx.pb.h"

namespace torch_ort {

namespace {

namespace pb = ::torch_ort_onnx;

constexpr int64_t kIrVersion = 10;

void fill_tensor(const TensorData& d, pb::TensorProto* t) {
  t->set_data_type(static_cast<int32_t>(d.dtype));
  for (int64_t x : d.dims) t->add_dims(x);
  t->set_raw_data(d.raw);  // raw_data for every dtype: one code path, exact bytes
}

// Type and shape of a value; a value of unknown dtype gets no type (ONNX: "unknown").
void fill_value_info(const Value& v, pb::ValueInfoProto* vi) {
  vi->set_name(v.name);
  if (v.dtype == DType::kUndefined) return;
  pb::TypeProto::Tensor* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(v.dtype));
  if (!v.shape.rank_known) return;
  pb::TensorShapeProto* shape = tt->mutable_shape();  // present even for rank 0 (a scalar)
  for (const Dim& d : v.shape.dims) {
    pb::TensorShapeProto::Dimension* dim = shape->add_dim();
    if (d.is_known()) dim->set_dim_value(d.value);
    else if (d.is_symbolic()) dim->set_dim_param(d.symbol);
  }
}

void fill_attribute(const std::string& name, const Attribute& a, pb::AttributeProto* p) {
  p->set_name(name);
  struct Visitor {
    pb::AttributeProto* p;
    void operator()(int64_t v) const { p->set_type(pb::AttributeProto_AttributeType_INT); p->set_i(v); }
    void operator()(float v) const { p->set_type(pb::AttributeProto_AttributeType_FLOAT); p->set_f(v); }
    void operator()(const std::string& v) const {
      p->set_type(pb::AttributeProto_AttributeType_STRING);
      p->set_s(v);
    }
    void operator()(const TensorData& v) const {
      p->set_type(pb::AttributeProto_AttributeType_TENSOR);
      fill_tensor(v, p->mutable_t());
    }
    void operator()(const std::vector<int64_t>& v) const {
      p->set_type(pb::AttributeProto_AttributeType_INTS);
      for (int64_t x : v) p->add_ints(x);
    }
    void operator()(const std::vector<float>& v) const {
      p->set_type(pb::AttributeProto_AttributeType_FLOATS);
      for (float x : v) p->add_floats(x);
    }
    void operator()(const std::vector<std::string>& v) const {
      p->set_type(pb::AttributeProto_AttributeType_STRINGS);
      for (const std::string& x : v) p->add_strings(x);
    }
  };
  std::visit(Visitor{p}, a);
}

}  // namespace

std::string export_onnx(const Graph& g) {
  const auto name_of = [&](ValueId v) -> const std::string& {
    static const std::string kEmpty;  // "" is ONNX for an omitted optional input/output
    if (v == kNoValue) return kEmpty;
    if (v < 0 || v >= g.num_values()) {
      throw std::invalid_argument("export_onnx: value id " + std::to_string(v) + " is out of range");
    }
    return g.value(v).name;
  };

  pb::ModelProto model;
  model.set_ir_version(kIrVersion);
  model.set_producer_name("torch_ort");
  // Every domain a node uses needs an opset import, or the checker rejects the model.
  std::map<std::string, int64_t> opsets = g.opset_imports;
  for (const Node& n : g.nodes) opsets.emplace(n.domain, 1);
  for (const auto& [domain, version] : opsets) {
    pb::OperatorSetIdProto* op = model.add_opset_import();
    op->set_domain(domain);
    op->set_version(version);
  }

  pb::GraphProto* gp = model.mutable_graph();
  gp->set_name(g.name);
  for (const auto& [v, data] : g.initializers) {
    pb::TensorProto* t = gp->add_initializer();
    t->set_name(name_of(v));
    fill_tensor(data, t);
  }
  for (ValueId v : g.inputs) fill_value_info(g.value(v), gp->add_input());
  for (ValueId v : g.outputs) fill_value_info(g.value(v), gp->add_output());

  // value_info for everything else a node produces, so dtypes and symbolic shapes survive.
  std::set<ValueId> listed(g.inputs.begin(), g.inputs.end());
  listed.insert(g.outputs.begin(), g.outputs.end());
  for (const Node& n : g.nodes) {
    pb::NodeProto* np = gp->add_node();
    np->set_op_type(n.op_type);
    if (!n.name.empty()) np->set_name(n.name);
    if (!n.domain.empty()) np->set_domain(n.domain);
    for (ValueId v : n.inputs) np->add_input(name_of(v));
    for (ValueId v : n.outputs) np->add_output(name_of(v));
    for (const auto& [name, a] : n.attrs.all()) fill_attribute(name, a, np->add_attribute());
    for (ValueId v : n.outputs) {
      if (v == kNoValue || g.value(v).dtype == DType::kUndefined || !listed.insert(v).second) continue;
      fill_value_info(g.value(v), gp->add_value_info());
    }
  }

  std::string bytes;
  if (!model.SerializeToString(&bytes)) {
    throw std::runtime_error("export_onnx: protobuf serialization failed (model over 2 GiB?)");
  }
  return bytes;
}

}  // namespace torch_ort
