// ModelProto fixtures built in C++ with the generated classes (tests never need python/onnx).
#pragma once

#include <cstdint>

#include "torch_ort_onnx.pb.h"

namespace torch_ort::testmodels {

namespace pb = ::torch_ort_onnx;

inline void set_tensor_type(pb::ValueInfoProto* vi, const char* name, int32_t elem_type) {
  vi->set_name(name);
  vi->mutable_type()->mutable_tensor_type()->set_elem_type(elem_type);
}

// An ONNX IR v3 style model: y = MatMul(x, w); z = Clip(y, "", "").
//   x: float [N, 2, <unknown>]; w is an initializer AND a graph input (as IR < 4 did).
//   Extra initializers use the typed fields: int64_data, int32_data, double_data, float16 bits.
inline pb::ModelProto typed_fields_model() {
  pb::ModelProto m;
  m.set_ir_version(3);
  auto* op = m.add_opset_import();
  op->set_domain("ai.onnx");
  op->set_version(13);
  pb::GraphProto* g = m.mutable_graph();
  g->set_name("typed");

  pb::TensorProto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(pb::TensorProto_DataType_FLOAT);
  w->add_dims(2), w->add_dims(2);
  for (float v : {1.f, 2.f, 3.f, 4.f}) w->add_float_data(v);
  pb::TensorProto* shape = g->add_initializer();
  shape->set_name("shape");
  shape->set_data_type(pb::TensorProto_DataType_INT64);
  shape->add_dims(2);
  shape->add_int64_data(-1), shape->add_int64_data(4);
  pb::TensorProto* i32 = g->add_initializer();
  i32->set_name("i32");
  i32->set_data_type(pb::TensorProto_DataType_INT32);
  i32->add_dims(2);
  i32->add_int32_data(7), i32->add_int32_data(-8);
  pb::TensorProto* d = g->add_initializer();
  d->set_name("d");
  d->set_data_type(pb::TensorProto_DataType_DOUBLE);  // scalar: no dims
  d->add_double_data(0.25);
  pb::TensorProto* h = g->add_initializer();
  h->set_name("h");
  h->set_data_type(pb::TensorProto_DataType_FLOAT16);
  h->add_dims(2);
  h->add_int32_data(0x3c00), h->add_int32_data(0xc000);  // 1.0, -2.0 as float16 bits
  pb::TensorProto* u8 = g->add_initializer();
  u8->set_name("u8");
  u8->set_data_type(pb::TensorProto_DataType_UINT8);
  u8->add_dims(2);
  u8->add_int32_data(0), u8->add_int32_data(255);

  pb::ValueInfoProto* x = g->add_input();
  set_tensor_type(x, "x", pb::TensorProto_DataType_FLOAT);
  auto* xs = x->mutable_type()->mutable_tensor_type()->mutable_shape();
  xs->add_dim()->set_dim_param("N");
  xs->add_dim()->set_dim_value(2);
  xs->add_dim();  // neither value nor param: unknown
  set_tensor_type(g->add_input(), "w", pb::TensorProto_DataType_FLOAT);

  pb::NodeProto* mm = g->add_node();
  mm->set_name("/mm");
  mm->set_op_type("MatMul");
  mm->add_input("x"), mm->add_input("w");
  mm->add_output("y");
  pb::AttributeProto* legacy = mm->add_attribute();  // no type field, as very old files
  legacy->set_name("legacy");
  legacy->set_i(3);
  pb::NodeProto* clip = g->add_node();
  clip->set_name("/clip");
  clip->set_op_type("Clip");
  clip->add_input("y"), clip->add_input(""), clip->add_input("");
  clip->add_output("z");

  pb::ValueInfoProto* y = g->add_value_info();
  set_tensor_type(y, "y", pb::TensorProto_DataType_FLOAT);
  auto* ys = y->mutable_type()->mutable_tensor_type()->mutable_shape();
  ys->add_dim()->set_dim_param("N");
  ys->add_dim()->set_dim_value(2);
  set_tensor_type(g->add_output(), "z", pb::TensorProto_DataType_FLOAT);
  return m;
}

}  // namespace torch_ort::testmodels
