// ONNX ModelProto bytes -> IR, through the generated lite classes (namespace torch_ort_onnx).
#include <cstring>
#include <optional>
#include <unordered_map>
#include <utility>

#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/limits.h"
#include "csrc/core/ir/onnx_io.h"
#include "csrc/core/ir/onnx_prescan.h"
#include "csrc/core/ir/verifier.h"
#include "torch_ort_onnx.pb.h"

namespace torch_ort {

namespace {

namespace pb = ::torch_ort_onnx;

struct TypeInfo {
  DType dtype = DType::kUndefined;
  Shape shape;
};

DType to_dtype(int32_t code, const std::string& what) {
  if (code == 0) return DType::kUndefined;
  if (!is_valid_dtype(code)) {
    throw OnnxImportError(what + " has ONNX element type " + std::to_string(code) +
                          " (e.g. float8/int4), which torch_ort does not support");
  }
  return static_cast<DType>(code);
}

TypeInfo to_type(const pb::ValueInfoProto& vi) {
  const std::string what = "value '" + vi.name() + "'";
  TypeInfo t;
  if (!vi.has_type() || vi.type().value_case() == pb::TypeProto::VALUE_NOT_SET) return t;
  if (!vi.type().has_tensor_type()) {
    throw OnnxImportError(what + " has a non-tensor type (sequence, map, optional or sparse), "
                          "which torch_ort does not support");
  }
  const pb::TypeProto::Tensor& tt = vi.type().tensor_type();
  t.dtype = to_dtype(tt.elem_type(), what);
  if (!tt.has_shape()) return t;  // rank unknown
  if (tt.shape().dim_size() > limits::kMaxRank) {
    throw OnnxImportError(what + " has rank " +
                          limits::over(tt.shape().dim_size(), "kMaxRank", limits::kMaxRank));
  }
  t.shape.rank_known = true;
  for (const pb::TensorShapeProto::Dimension& d : tt.shape().dim()) {
    // An over-long symbol is as good as unknown: it costs the model a symbol, not the whole import.
    const bool long_symbol =
        d.has_dim_param() && static_cast<int64_t>(d.dim_param().size()) > limits::kMaxSymbolBytes;
    if (d.has_dim_value()) t.shape.dims.push_back(Dim::known(d.dim_value()));
    else if (long_symbol) t.shape.dims.push_back(Dim{});
    else if (d.has_dim_param() && !d.dim_param().empty()) t.shape.dims.push_back(Dim::symbolic(d.dim_param()));
    else t.shape.dims.push_back(Dim{});  // neither: a dimension of unknown size
  }
  // A negative dim_value reads as unknown (Dim::is_known); huge known sizes are refused.
  if (std::string why = limits::check_shape(t.shape); !why.empty()) {
    throw OnnxImportError(what + " has shape " + t.shape.to_string() + ": " + why);
  }
  return t;
}

// Appends `src` elements to raw bytes as type T (the little-endian layout of raw_data).
template <typename T, typename Src>
void pack(const Src& src, std::string& raw) {
  for (const auto& x : src) {
    const T v = static_cast<T>(x);
    raw.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
}

// Running totals over the whole model, checked against limits.h as the importer goes.
struct Budget {
  int64_t constant_bytes = 0;  // decoded constant data so far (kMaxConstantBytes)
};

// How many values the typed field of `dtype` holds, and its name (raw_data absent).
std::pair<int64_t, const char*> typed_count(const pb::TensorProto& t, DType dtype) {
  switch (dtype) {
    case DType::kFloat: case DType::kComplex64: return {t.float_data_size(), "float_data"};
    case DType::kDouble: case DType::kComplex128: return {t.double_data_size(), "double_data"};
    case DType::kInt64: return {t.int64_data_size(), "int64_data"};
    case DType::kUInt32: case DType::kUInt64: return {t.uint64_data_size(), "uint64_data"};
    default: return {t.int32_data_size(), "int32_data"};
  }
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string out;
  for (int64_t x : dims) out += (out.empty() ? "" : ",") + std::to_string(x);
  return "[" + out + "]";
}

// `what` says where the tensor sits ("initializer 'w'", "attribute 'value' of node ...").
TensorData to_tensor(const pb::TensorProto& t, const std::string& what, Budget& budget) {
  if (t.data_location() == pb::TensorProto_DataLocation_EXTERNAL || t.external_data_size() > 0) {
    throw OnnxImportError(what + " stores its data externally (data_location=EXTERNAL); "
                          "torch_ort needs every tensor embedded in the model bytes");
  }
  if (t.has_segment()) throw OnnxImportError(what + " is a segmented tensor, which is not supported");
  TensorData d;
  d.dtype = to_dtype(t.data_type(), what);
  if (d.dtype == DType::kUndefined || d.dtype == DType::kString) {
    throw OnnxImportError(what + " has element type " + std::string(dtype_name(d.dtype)) +
                          ", which torch_ort cannot hold as a constant");
  }
  if (t.dims_size() > limits::kMaxRank) {
    throw OnnxImportError(what + " has rank " + limits::over(t.dims_size(), "kMaxRank", limits::kMaxRank));
  }
  d.dims.assign(t.dims().begin(), t.dims().end());
  for (int64_t x : d.dims) {
    if (x < 0) throw OnnxImportError(what + " has a negative dimension " + std::to_string(x));
  }
  std::string why;
  const std::optional<int64_t> numel = limits::bounded_numel(d.dims, &why);
  if (!numel) throw OnnxImportError(what + " has dims " + dims_text(d.dims) + ": " + why);
  const int64_t expected = *numel * dtype_size(d.dtype);  // <= 2^48 * 16: cannot overflow
  if (expected > limits::kMaxConstantBytes - budget.constant_bytes) {
    throw OnnxImportError(what + " holds " + std::to_string(expected) + " bytes of data (" +
                          std::string(dtype_name(d.dtype)) + " " + dims_text(d.dims) +
                          "); with the constants before it that is " +
                          limits::over(budget.constant_bytes + expected, "kMaxConstantBytes",
                                       limits::kMaxConstantBytes) + " bytes");
  }
  budget.constant_bytes += expected;
  const auto [typed, field] = typed_count(t, d.dtype);
  if (t.has_raw_data()) {
    if (typed > 0) {
      throw OnnxImportError(what + " has both raw_data and " + std::to_string(typed) + " values in " +
                            field + "; a tensor holds its data in one of them");
    }
    if (static_cast<int64_t>(t.raw_data().size()) != expected) {
      throw OnnxImportError(what + " has " + std::to_string(t.raw_data().size()) +
                            " bytes of raw_data, expected " + std::to_string(expected) + " for " +
                            std::string(dtype_name(d.dtype)) + " " + dims_text(d.dims));
    }
    d.raw = t.raw_data();
  } else {
    // Counted before packing, so a wrong count never allocates what the dims do not justify.
    const bool complex = d.dtype == DType::kComplex64 || d.dtype == DType::kComplex128;
    const int64_t want = complex ? 2 * *numel : *numel;
    if (typed != want) {
      throw OnnxImportError(what + " has " + std::to_string(typed) + " values in " + field +
                            ", expected " + std::to_string(want) + " for " +
                            std::string(dtype_name(d.dtype)) + " " + dims_text(d.dims));
    }
    // Typed fields: small ints, float16 and bfloat16 travel as int32 (bit patterns for 16-bit
    // floats), unsigned 32/64-bit ints as uint64, complex as (re, im) pairs.
    switch (d.dtype) {
      case DType::kFloat: case DType::kComplex64: pack<float>(t.float_data(), d.raw); break;
      case DType::kDouble: case DType::kComplex128: pack<double>(t.double_data(), d.raw); break;
      case DType::kInt64: pack<int64_t>(t.int64_data(), d.raw); break;
      case DType::kInt32: pack<int32_t>(t.int32_data(), d.raw); break;
      case DType::kInt16: pack<int16_t>(t.int32_data(), d.raw); break;
      case DType::kInt8: pack<int8_t>(t.int32_data(), d.raw); break;
      case DType::kUInt16: case DType::kFloat16: case DType::kBFloat16:
        pack<uint16_t>(t.int32_data(), d.raw); break;
      case DType::kUInt8: case DType::kBool: pack<uint8_t>(t.int32_data(), d.raw); break;
      case DType::kUInt32: pack<uint32_t>(t.uint64_data(), d.raw); break;
      case DType::kUInt64: pack<uint64_t>(t.uint64_data(), d.raw); break;
      default: break;
    }
  }
  if (static_cast<int64_t>(d.raw.size()) != expected) {  // a dtype the switch does not pack
    throw OnnxImportError(what + " has " + std::to_string(d.raw.size()) + " bytes of data, expected " +
                          std::to_string(expected) + " for " + std::string(dtype_name(d.dtype)) +
                          " " + dims_text(d.dims));
  }
  return d;
}

// Per-axis attributes of standard ops: one entry per axis (two for pads), so at most 2 x kMaxRank.
bool is_shape_attribute(const std::string& name) {
  static const char* const kNames[] = {"perm", "axes", "pads", "strides", "dilations", "kernel_shape",
                                       "output_padding", "output_shape", "starts", "ends"};
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

void check_list_length(int64_t n, const std::string& what, bool per_axis) {
  if (per_axis && n > limits::kMaxShapeAttributeElements) {
    throw OnnxImportError(what + " has " + limits::over(n, "kMaxShapeAttributeElements",
                                                        limits::kMaxShapeAttributeElements) +
                          " entries (one or two per axis)");
  }
  if (n > limits::kMaxAttributeElements) {
    throw OnnxImportError(what + " has " +
                          limits::over(n, "kMaxAttributeElements", limits::kMaxAttributeElements) +
                          " entries");
  }
}

void check_string_length(const std::string& str, const std::string& what) {
  if (static_cast<int64_t>(str.size()) > limits::kMaxAttributeStringBytes) {
    throw OnnxImportError(what + " holds a string of " +
                          limits::over(static_cast<int64_t>(str.size()), "kMaxAttributeStringBytes",
                                       limits::kMaxAttributeStringBytes) + " bytes");
  }
}

// `standard`: the node is in the ONNX domain, where per-axis attribute names mean what they say.
Attribute to_attribute(const pb::AttributeProto& a, const std::string& who, bool standard,
                       Budget& budget) {
  const std::string what = "attribute '" + a.name() + "' of " + who;
  if (!a.ref_attr_name().empty()) {
    throw OnnxImportError(what + " refers to a function attribute, which is not supported");
  }
  auto type = a.type();
  if (type == pb::AttributeProto_AttributeType_UNDEFINED) {  // very old exporters left it unset
    if (a.has_i()) type = pb::AttributeProto_AttributeType_INT;
    else if (a.has_f()) type = pb::AttributeProto_AttributeType_FLOAT;
    else if (a.has_s()) type = pb::AttributeProto_AttributeType_STRING;
    else if (a.has_t()) type = pb::AttributeProto_AttributeType_TENSOR;
    else if (a.ints_size()) type = pb::AttributeProto_AttributeType_INTS;
    else if (a.floats_size()) type = pb::AttributeProto_AttributeType_FLOATS;
    else if (a.strings_size()) type = pb::AttributeProto_AttributeType_STRINGS;
  }
  const bool per_axis = standard && is_shape_attribute(a.name());
  switch (type) {
    case pb::AttributeProto_AttributeType_INT: return a.i();
    case pb::AttributeProto_AttributeType_FLOAT: return a.f();
    case pb::AttributeProto_AttributeType_STRING:
      check_string_length(a.s(), what);
      return a.s();
    case pb::AttributeProto_AttributeType_TENSOR: return to_tensor(a.t(), what, budget);
    case pb::AttributeProto_AttributeType_INTS:
      check_list_length(a.ints_size(), what, per_axis);
      return std::vector<int64_t>(a.ints().begin(), a.ints().end());
    case pb::AttributeProto_AttributeType_FLOATS:
      check_list_length(a.floats_size(), what, per_axis);
      return std::vector<float>(a.floats().begin(), a.floats().end());
    case pb::AttributeProto_AttributeType_STRINGS:
      check_list_length(a.strings_size(), what, per_axis);
      for (const std::string& x : a.strings()) check_string_length(x, what);
      return std::vector<std::string>(a.strings().begin(), a.strings().end());
    default: {
      const std::string& kind = pb::AttributeProto_AttributeType_Name(type);
      throw OnnxImportError(what + " has kind " + (kind.empty() ? std::to_string(type) : kind) +
                            ", which torch_ort does not support (subgraphs, sparse tensors and type "
                            "protos must be inlined or lowered by the exporter)");
    }
  }
}

}  // namespace

Graph import_onnx(std::string_view bytes) {
  if (static_cast<int64_t>(bytes.size()) > limits::kMaxModelBytes) {
    throw OnnxImportError("the model is " +
                          limits::over(static_cast<int64_t>(bytes.size()), "kMaxModelBytes",
                                       limits::kMaxModelBytes) +
                          " bytes (protobuf's cap on one message); move large weights out of the "
                          "graph (ORTModule binds parameters as graph inputs)");
  }
  prescan_model(bytes);  // counts and malformed bytes refused before the parser allocates
  pb::ModelProto model;
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {  // <= 2 GiB: fits int
    throw OnnxImportError("not a valid ONNX ModelProto: " + std::to_string(bytes.size()) +
                          " bytes failed to parse (truncated or not an .onnx file?)");
  }
  if (!model.has_graph()) {
    throw OnnxImportError("not a valid ONNX ModelProto: it has no graph (" +
                          std::to_string(bytes.size()) + " bytes; truncated or empty?)");
  }
  if (model.functions_size() > 0) {
    throw OnnxImportError("model-local functions are not supported (the model defines " +
                          std::to_string(model.functions_size()) + ", first '" +
                          model.functions(0).name() + "'); export with functions inlined");
  }
  const pb::GraphProto& gp = model.graph();
  if (gp.node_size() > limits::kMaxNodes) {
    throw OnnxImportError("graph '" + gp.name() + "' has " +
                          limits::over(gp.node_size(), "kMaxNodes", limits::kMaxNodes) + " nodes");
  }
  const std::pair<int64_t, const char*> lists[] = {{gp.initializer_size(), "initializers"},
                                                   {gp.input_size(), "graph inputs"},
                                                   {gp.output_size(), "graph outputs"},
                                                   {gp.value_info_size(), "value_info entries"}};
  for (const auto& [n, kind] : lists) {
    if (n > limits::kMaxValues) {
      throw OnnxImportError("graph '" + gp.name() + "' has " +
                            limits::over(n, "kMaxValues", limits::kMaxValues) + " " + kind);
    }
  }
  Budget budget;
  Graph g;
  if (!gp.name().empty()) g.name = gp.name();
  if (model.opset_import_size() > 0) {
    g.opset_imports.clear();
    for (const auto& op : model.opset_import()) {
      g.opset_imports[op.domain() == "ai.onnx" ? std::string() : op.domain()] = op.version();
    }
  }
  if (gp.sparse_initializer_size() > 0) {
    throw OnnxImportError("graph '" + gp.name() + "' has sparse initializers, which are not supported");
  }

  for (const pb::TensorProto& t : gp.initializer()) {
    const std::string what = "initializer '" + t.name() + "'";
    if (t.name().empty()) throw OnnxImportError("an initializer has an empty name");
    if (g.find(t.name())) throw OnnxImportError(what + " is defined twice");
    TensorData data = to_tensor(t, what, budget);
    std::vector<Dim> dims;
    for (int64_t x : data.dims) dims.push_back(Dim::known(x));
    const ValueId v = g.add_value(t.name(), data.dtype, Shape::of(std::move(dims)));
    g.initializers.emplace(v, std::move(data));
  }
  for (const pb::ValueInfoProto& vi : gp.input()) {
    if (vi.name().empty()) throw OnnxImportError("a graph input has an empty name");
    if (auto v = g.find(vi.name())) {
      // ONNX IR < 4 lists initializers among the inputs too: they stay constants.
      if (g.initializers.count(*v)) continue;
      throw OnnxImportError("graph input '" + vi.name() + "' is listed twice");
    }
    TypeInfo t = to_type(vi);
    g.inputs.push_back(g.add_value(vi.name(), t.dtype, std::move(t.shape)));
  }
  // Types of node outputs come from value_info and graph outputs, applied when created.
  std::unordered_map<std::string, TypeInfo> types;
  for (const auto& vi : gp.value_info()) {
    // A sequence-typed intermediate (SplitToSequence's output) stays untyped: the
    // sequence_to_split pass rewrites it away, or fails naming the op that reads it otherwise.
    if (vi.has_type() && vi.type().has_sequence_type()) continue;
    types[vi.name()] = to_type(vi);
  }
  for (const auto& vi : gp.output()) types[vi.name()] = to_type(vi);

  // Outputs first, then inputs: accepts files whose nodes are not topologically sorted.
  g.nodes.reserve(static_cast<size_t>(gp.node_size()));
  for (const pb::NodeProto& np : gp.node()) {
    Node n;
    n.domain = np.domain() == "ai.onnx" ? std::string() : np.domain();
    n.op_type = np.op_type();
    n.name = np.name();
    const std::string who = "node " + n.describe();
    if (g.num_values() + static_cast<int64_t>(np.output_size()) > limits::kMaxValues) {
      throw OnnxImportError(who + " brings the graph's values (inputs, initializers, node outputs) to " +
                            limits::over(g.num_values() + static_cast<int64_t>(np.output_size()),
                                         "kMaxValues", limits::kMaxValues));
    }
    for (const std::string& out : np.output()) {
      if (out.empty()) { n.outputs.push_back(kNoValue); continue; }
      if (g.find(out)) {
        throw OnnxImportError(who + " produces value '" + out +
                              "', which is already defined (graph input, initializer or another node)");
      }
      auto it = types.find(out);
      TypeInfo t = it == types.end() ? TypeInfo{} : it->second;
      n.outputs.push_back(g.add_value(out, t.dtype, std::move(t.shape)));
    }
    for (const pb::AttributeProto& a : np.attribute()) {
      if (n.attrs.has(a.name())) throw OnnxImportError(who + " has attribute '" + a.name() + "' twice");
      n.attrs.set(a.name(), to_attribute(a, who, n.domain.empty(), budget));
    }
    g.nodes.push_back(std::move(n));
  }
  for (int i = 0; i < gp.node_size(); ++i) {
    Node& n = g.nodes[static_cast<size_t>(i)];
    for (const std::string& in : gp.node(i).input()) {
      if (in.empty()) { n.inputs.push_back(kNoValue); continue; }  // omitted optional input
      auto v = g.find(in);
      if (!v) {
        throw OnnxImportError("node " + n.describe() + " reads value '" + in +
                              "', which is not a graph input, initializer or output of any node");
      }
      n.inputs.push_back(*v);
    }
  }
  for (const pb::ValueInfoProto& vi : gp.output()) {
    auto v = g.find(vi.name());
    if (!v) {
      throw OnnxImportError("graph output '" + vi.name() +
                            "' is not produced by any node, nor a graph input or initializer");
    }
    g.outputs.push_back(*v);
  }
  // Before any reader (type inference, shape rules, passes, gradient rules) meets one.
  for (const Node& n : g.nodes) {
    if (std::string why = attribute_kind_problem(n); !why.empty())
      throw OnnxImportError("node " + n.describe() + ": " + why);
  }
  try {
    topological_sort(g);  // stable: a sorted file (the normal case) keeps its order
  } catch (const VerifyError& e) {
    throw OnnxImportError(std::string("the ONNX graph is not a DAG: ") + e.what());
  }
  return g;
}

}  // namespace torch_ort
