// libFuzzer target: model bytes through every stage the engine runs on a loaded graph, without
// torch (csrc/runtime/engine.cc): import -> topological sort -> dtypes -> verify -> shapes ->
// forward passes -> gradients -> shapes -> training passes -> recompute -> plan -> verify ->
// export and re-import. The core's own errors are clean rejections; anything else escaping (a
// std:: exception, a sanitizer report, a timeout, an allocation over -rss_limit_mb) is a bug.
//
// The custom mutator edits the ModelProto structurally half the time (dims, dtypes, edges, nodes,
// op types, attributes, initializers), so that mutated valid training graphs get past the parser.
//   scripts/fuzz.sh 300                                   # 5 minutes over tests/fuzz/corpus
//   build/sanitize/fuzz_model_loading crash-<sha1>        # replay one input
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/shapes/shape_rules.h"
#include "tests/fuzz/fuzz_pipeline.h"
#include "torch_ort_onnx.pb.h"

using namespace torch_ort;
// Not "pb": protobuf declares a global namespace pb of its own.
namespace onnx_pb = ::torch_ort_onnx;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A view of libFuzzer's exact buffer: ASan reports a read one byte past the input.
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    torch_ort::fuzz::compile_like_the_engine(bytes);
  } catch (const OnnxImportError&) {
  } catch (const VerifyError&) {
  } catch (const GradientError&) {
  } catch (const UnsupportedOpError&) {
  }
  // Any other exception escapes: std::terminate, which libFuzzer reports as a crash.
  return 0;
}

// ------------------------------------------------------------------------------------------------
// Structure-aware mutation.

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

using Rng = std::mt19937_64;

size_t pick(Rng& rng, size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng); }
bool coin(Rng& rng) { return rng() & 1; }

// Sizes that break arithmetic: zero, one, negative, near 2^31 and 2^63, and plain small ones.
int64_t interesting_int(Rng& rng) {
  static const int64_t kValues[] = {0, 1, 2, 3, -1, -2, 7, 64, 255, 256, 65535, 1 << 20,
                                    std::numeric_limits<int32_t>::max(),
                                    std::numeric_limits<int32_t>::min(),
                                    int64_t{1} << 32, int64_t{1} << 40, int64_t{1} << 62,
                                    std::numeric_limits<int64_t>::max(),
                                    std::numeric_limits<int64_t>::min()};
  if (coin(rng)) return static_cast<int64_t>(pick(rng, 9)) - 4;
  return kValues[pick(rng, std::size(kValues))];
}

float interesting_float(Rng& rng) {
  static const float kValues[] = {0.f, -0.f, 1.f, -1.f, 0.5f, 1e-12f, 1e30f,
                                  std::numeric_limits<float>::infinity(),
                                  -std::numeric_limits<float>::infinity(),
                                  std::numeric_limits<float>::quiet_NaN(),
                                  std::numeric_limits<float>::denorm_min()};
  return kValues[pick(rng, std::size(kValues))];
}

using Op = std::pair<std::string, std::string>;  // (domain, op_type)

// Every value name the graph mentions, the graph's ops and the ops the core has rules for.
struct Names {
  std::vector<std::string> values;
  std::vector<Op> ops;          // of this graph
  const std::vector<Op>* known;  // of the registries
};

Names collect_names(const onnx_pb::GraphProto& g) {
  Names n;
  for (const auto& vi : g.input()) n.values.push_back(vi.name());
  for (const auto& vi : g.output()) n.values.push_back(vi.name());
  for (const auto& t : g.initializer()) n.values.push_back(t.name());
  for (const auto& node : g.node()) {
    for (const auto& o : node.output()) n.values.push_back(o);
    n.ops.emplace_back(node.domain(), node.op_type());
  }
  static const std::vector<Op> known = [] {
    std::vector<Op> out;
    std::vector<std::string> keys = GradientRegistry::instance().ops();
    for (const std::string& k : ShapeRegistry::instance().ops()) keys.push_back(k);
    for (const std::string& k : keys) {
      const size_t sep = k.find("::");
      if (sep != std::string::npos) out.emplace_back(k.substr(0, sep), k.substr(sep + 2));
    }
    return out;
  }();
  n.known = &known;
  return n;
}

// The typed value infos of the graph (inputs, outputs, value_info).
std::vector<onnx_pb::ValueInfoProto*> value_infos(onnx_pb::GraphProto& g) {
  std::vector<onnx_pb::ValueInfoProto*> out;
  for (auto& vi : *g.mutable_input()) out.push_back(&vi);
  for (auto& vi : *g.mutable_output()) out.push_back(&vi);
  for (auto& vi : *g.mutable_value_info()) out.push_back(&vi);
  return out;
}

void mutate_shape(onnx_pb::ValueInfoProto& vi, Rng& rng) {
  onnx_pb::TypeProto_Tensor* tt = vi.mutable_type()->mutable_tensor_type();
  switch (pick(rng, 6)) {
    case 0:  // a new element type, valid or not
      tt->set_elem_type(static_cast<int32_t>(pick(rng, 26)) - (coin(rng) ? 0 : 2));
      return;
    case 1:  // unknown rank
      tt->clear_shape();
      return;
    case 2: {  // rank + 1
      auto* d = tt->mutable_shape()->add_dim();
      if (coin(rng)) d->set_dim_value(interesting_int(rng));
      else d->set_dim_param(coin(rng) ? "batch" : "fuzz_dim");
      return;
    }
    case 3:  // rank - 1
      if (tt->shape().dim_size() > 0) tt->mutable_shape()->mutable_dim()->RemoveLast();
      return;
    default: {  // one dim: a size, a symbol, or nothing
      const int n = tt->shape().dim_size();
      if (n == 0) return;
      auto* d = tt->mutable_shape()->mutable_dim(static_cast<int>(pick(rng, static_cast<size_t>(n))));
      switch (pick(rng, 4)) {
        case 0: d->set_dim_value(interesting_int(rng)); break;
        case 1: d->set_dim_value(-d->dim_value()); break;
        case 2: d->set_dim_param(coin(rng) ? "batch" : std::string(pick(rng, 3), 's')); break;
        default: d->clear_dim_value(); d->clear_dim_param(); break;
      }
    }
  }
}

void mutate_tensor(onnx_pb::TensorProto& t, Rng& rng) {
  switch (pick(rng, 8)) {
    case 0:
      t.set_data_type(static_cast<int32_t>(pick(rng, 26)));
      return;
    case 1:  // truncate (or extend) the data
      if (t.has_raw_data()) t.mutable_raw_data()->resize(pick(rng, t.raw_data().size() + 9));
      else if (t.int64_data_size() > 0) t.mutable_int64_data()->RemoveLast();
      else if (t.float_data_size() > 0) t.mutable_float_data()->RemoveLast();
      else if (t.int32_data_size() > 0) t.mutable_int32_data()->RemoveLast();
      return;
    case 2:
      if (t.dims_size() > 0) t.set_dims(static_cast<int>(pick(rng, static_cast<size_t>(t.dims_size()))), interesting_int(rng));
      return;
    case 3:
      if (coin(rng) && t.dims_size() > 0) t.mutable_dims()->RemoveLast();
      else t.add_dims(interesting_int(rng));
      return;
    case 4: {  // one int64 value (shape/axes constants)
      if (t.has_raw_data() && t.data_type() == onnx_pb::TensorProto_DataType_INT64 && t.raw_data().size() >= 8) {
        const int64_t v = interesting_int(rng);
        const size_t at = 8 * pick(rng, t.raw_data().size() / 8);
        std::memcpy(&(*t.mutable_raw_data())[at], &v, sizeof v);
      } else if (t.int64_data_size() > 0) {
        t.set_int64_data(static_cast<int>(pick(rng, static_cast<size_t>(t.int64_data_size()))), interesting_int(rng));
      } else {
        t.add_int64_data(interesting_int(rng));
      }
      return;
    }
    case 5:  // one float value
      if (t.has_raw_data() && t.data_type() == onnx_pb::TensorProto_DataType_FLOAT && t.raw_data().size() >= 4) {
        const float v = interesting_float(rng);
        const size_t at = 4 * pick(rng, t.raw_data().size() / 4);
        std::memcpy(&(*t.mutable_raw_data())[at], &v, sizeof v);
      } else {
        t.add_float_data(interesting_float(rng));
      }
      return;
    case 6:  // raw <-> typed
      if (t.has_raw_data()) t.clear_raw_data();
      else t.set_raw_data(std::string(pick(rng, 17), '\x01'));
      return;
    default:
      t.set_data_location(coin(rng) ? onnx_pb::TensorProto_DataLocation_EXTERNAL : onnx_pb::TensorProto_DataLocation_DEFAULT);
      return;
  }
}

void mutate_attribute(onnx_pb::AttributeProto& a, Rng& rng) {
  switch (pick(rng, 8)) {
    case 0:
      a.set_i(interesting_int(rng));
      if (coin(rng)) a.set_type(onnx_pb::AttributeProto_AttributeType_INT);
      return;
    case 1:
      a.set_f(interesting_float(rng));
      if (coin(rng)) a.set_type(onnx_pb::AttributeProto_AttributeType_FLOAT);
      return;
    case 2:  // one list element, or the list's length
      if (a.ints_size() > 0 && coin(rng)) a.set_ints(static_cast<int>(pick(rng, static_cast<size_t>(a.ints_size()))), interesting_int(rng));
      else if (a.ints_size() > 0 && coin(rng)) a.mutable_ints()->RemoveLast();
      else a.add_ints(interesting_int(rng));
      return;
    case 3:
      if (a.floats_size() > 0 && coin(rng)) a.set_floats(static_cast<int>(pick(rng, static_cast<size_t>(a.floats_size()))), interesting_float(rng));
      else a.add_floats(interesting_float(rng));
      return;
    case 4:  // a different kind than the op expects
      a.set_type(static_cast<onnx_pb::AttributeProto_AttributeType>(pick(rng, 15)));
      return;
    case 5:
      if (a.has_t()) mutate_tensor(*a.mutable_t(), rng);
      else a.mutable_t()->add_dims(interesting_int(rng));
      return;
    case 6:
      a.set_s(coin(rng) ? "none" : std::string(pick(rng, 5), 'x'));
      return;
    default:
      a.set_name(coin(rng) ? "axis" : "perm");
      return;
  }
}

void mutate_node(onnx_pb::GraphProto& g, const Names& names, Rng& rng) {
  if (g.node_size() == 0) return;
  const int i = static_cast<int>(pick(rng, static_cast<size_t>(g.node_size())));
  onnx_pb::NodeProto& n = *g.mutable_node(i);
  switch (pick(rng, 10)) {
    case 0: {  // an input reads another value (or none, or a name nothing defines)
      const std::string v = coin(rng) && !names.values.empty() ? names.values[pick(rng, names.values.size())]
                                                               : (coin(rng) ? "" : "fuzz_undefined");
      if (n.input_size() > 0 && coin(rng)) n.set_input(static_cast<int>(pick(rng, static_cast<size_t>(n.input_size()))), v);
      else if (coin(rng)) n.add_input(v);
      else if (n.input_size() > 0) n.mutable_input()->RemoveLast();
      return;
    }
    case 1: {  // an output renamed to an existing value (SSA breaks) or dropped
      const std::string v = coin(rng) && !names.values.empty() ? names.values[pick(rng, names.values.size())] : "";
      if (n.output_size() > 0 && coin(rng)) n.set_output(static_cast<int>(pick(rng, static_cast<size_t>(n.output_size()))), v);
      else if (coin(rng)) n.add_output(v.empty() ? "fuzz_out" : v);
      else if (n.output_size() > 0) n.mutable_output()->RemoveLast();
      return;
    }
    case 2:  // swap two inputs
      if (n.input_size() >= 2)
        n.mutable_input()->SwapElements(static_cast<int>(pick(rng, static_cast<size_t>(n.input_size()))),
                                        static_cast<int>(pick(rng, static_cast<size_t>(n.input_size()))));
      return;
    case 3: {  // another op of this graph, or any op the core knows
      const std::vector<Op>& from = coin(rng) || names.known->empty() ? names.ops : *names.known;
      const auto& [domain, op] = from[pick(rng, from.size())];
      n.set_op_type(op);
      n.set_domain(domain);
      return;
    }
    case 4:  // delete
      g.mutable_node()->DeleteSubrange(i, 1);
      return;
    case 5:  // duplicate (outputs defined twice)
      *g.add_node() = n;
      return;
    case 6:  // reorder
      g.mutable_node()->SwapElements(i, static_cast<int>(pick(rng, static_cast<size_t>(g.node_size()))));
      return;
    case 7:  // drop an attribute
      if (n.attribute_size() > 0) n.mutable_attribute()->DeleteSubrange(static_cast<int>(pick(rng, static_cast<size_t>(n.attribute_size()))), 1);
      return;
    default:
      if (n.attribute_size() > 0) mutate_attribute(*n.mutable_attribute(static_cast<int>(pick(rng, static_cast<size_t>(n.attribute_size())))), rng);
      else mutate_attribute(*n.add_attribute(), rng);
      return;
  }
}

void mutate_model(onnx_pb::ModelProto& m, Rng& rng) {
  onnx_pb::GraphProto& g = *m.mutable_graph();
  const Names names = collect_names(g);
  switch (pick(rng, 10)) {
    case 0:
    case 1: {
      std::vector<onnx_pb::ValueInfoProto*> vis = value_infos(g);
      if (!vis.empty()) mutate_shape(*vis[pick(rng, vis.size())], rng);
      return;
    }
    case 2:
    case 3:
    case 4:
    case 5:
      mutate_node(g, names, rng);
      return;
    case 6:
      if (g.initializer_size() > 0) mutate_tensor(*g.mutable_initializer(static_cast<int>(pick(rng, static_cast<size_t>(g.initializer_size())))), rng);
      return;
    case 7:  // drop an initializer, an input or an output
      switch (pick(rng, 3)) {
        case 0: if (g.initializer_size() > 0) g.mutable_initializer()->DeleteSubrange(static_cast<int>(pick(rng, static_cast<size_t>(g.initializer_size()))), 1); break;
        case 1: if (g.input_size() > 0) g.mutable_input()->DeleteSubrange(static_cast<int>(pick(rng, static_cast<size_t>(g.input_size()))), 1); break;
        default: if (g.output_size() > 0) g.mutable_output()->DeleteSubrange(static_cast<int>(pick(rng, static_cast<size_t>(g.output_size()))), 1); break;
      }
      return;
    case 8:  // an output or input named after another value / twice
      if (!names.values.empty()) {
        if (coin(rng) && g.output_size() > 0) g.mutable_output(static_cast<int>(pick(rng, static_cast<size_t>(g.output_size()))))->set_name(names.values[pick(rng, names.values.size())]);
        else if (g.input_size() > 0) *g.add_input() = g.input(static_cast<int>(pick(rng, static_cast<size_t>(g.input_size()))));
      }
      return;
    default:  // opset version
      if (m.opset_import_size() > 0) m.mutable_opset_import(0)->set_version(interesting_int(rng));
      return;
  }
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  Rng rng(seed);
  if (coin(rng)) return LLVMFuzzerMutate(data, size, max_size);
  onnx_pb::ModelProto m;
  if (!m.ParseFromArray(data, static_cast<int>(size)) || !m.has_graph())
    return LLVMFuzzerMutate(data, size, max_size);
  const size_t rounds = 1 + pick(rng, 3);
  for (size_t r = 0; r < rounds; ++r) mutate_model(m, rng);
  std::string out;
  if (!m.SerializeToString(&out) || out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

// Splices the nodes, initializers and value infos of a second model into a copy of the first.
extern "C" size_t LLVMFuzzerCustomCrossOver(const uint8_t* data1, size_t size1, const uint8_t* data2,
                                            size_t size2, uint8_t* out, size_t max_out_size,
                                            unsigned int seed) {
  Rng rng(seed);
  onnx_pb::ModelProto a, b;
  if (!a.ParseFromArray(data1, static_cast<int>(size1)) || !b.ParseFromArray(data2, static_cast<int>(size2)) ||
      !a.has_graph() || !b.has_graph() || b.graph().node_size() == 0)
    return 0;
  onnx_pb::GraphProto& ga = *a.mutable_graph();
  const onnx_pb::GraphProto& gb = b.graph();
  const int start = static_cast<int>(pick(rng, static_cast<size_t>(gb.node_size())));
  const int count = 1 + static_cast<int>(pick(rng, std::min<size_t>(8, static_cast<size_t>(gb.node_size() - start))));
  const int at = static_cast<int>(pick(rng, static_cast<size_t>(ga.node_size()) + 1));
  for (int k = 0; k < count; ++k) {
    *ga.add_node() = gb.node(start + k);
    for (int j = ga.node_size() - 1; j > at + k; --j) ga.mutable_node()->SwapElements(j, j - 1);
  }
  for (const auto& vi : gb.value_info()) if (coin(rng)) *ga.add_value_info() = vi;
  for (const auto& t : gb.initializer()) if (pick(rng, 4) == 0) *ga.add_initializer() = t;
  std::string s;
  if (!a.SerializeToString(&s) || s.size() > max_out_size) return 0;
  std::memcpy(out, s.data(), s.size());
  return s.size();
}
