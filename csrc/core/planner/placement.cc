// Host/device placement (placement.h): the host-input table, the choice of host nodes, and the
// rewrite that makes every crossing an explicit ToHost/ToDevice node.
#include "csrc/core/planner/placement.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "csrc/core/ir/aten_op.h"
#include "csrc/core/ir/op_traits.h"

namespace torch_ort {
namespace {

// Shape and Size read only their input's sizes: it may live anywhere, and they compute on the host.
bool reads_metadata_only(const Node& n) { return op_traits(n).reads_metadata_only; }


// A value small enough for the host: a static size of at most kMaxHostElements elements.
bool is_small(const Graph& g, ValueId v) {
  const Shape& s = g.value(v).shape;
  if (!s.rank_known || g.value(v).dtype == DType::kString) return false;
  int64_t n = 1;
  for (const Dim& d : s.dims) {
    if (!d.is_known()) return false;
    n *= d.value;
    if (n > kMaxHostElements) return false;
  }
  return true;
}

enum class Need : uint8_t { kAny, kHost, kDevice };

}  // namespace

std::vector<int> host_inputs(const Node& n) {
  // Most ops: a fixed list of positions, their trait (ops/<family>.cc, from the kernels'
  // KernelCtx::input_ints / input_scalar / input_flag). Positions past a node's inputs (an older
  // opset's form) are ignored.
  // Others, such as ConcatGrad's shapes or ATenOp's numeric arguments, depend on the node: the
  // op's more_host_inputs hook adds them.
  const OpTraits& traits = op_traits(n);
  std::vector<int> out = traits.host_inputs;
  if (traits.more_host_inputs) traits.more_host_inputs(n, out);
  const int count = static_cast<int>(n.inputs.size());
  out.erase(std::remove_if(out.begin(), out.end(), [&](int i) { return i < 0 || i >= count; }), out.end());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> host_outputs(const Node& n) {
  std::vector<int> out = op_traits(n).host_outputs;
  const int count = static_cast<int>(n.outputs.size());
  out.erase(std::remove_if(out.begin(), out.end(), [&](int i) { return i < 0 || i >= count; }), out.end());
  return out;
}

Placement place_host_values(Graph& g, std::vector<ValueId>* device_roots) {
  const GraphIndex idx(g);
  const size_t num_nodes = g.nodes.size();

  // Constants: initializers and Constant-node outputs. Either side may read them without a
  // transfer (a side that lacks one gets its own copy below).
  std::vector<char> constant(g.num_values(), 0);
  for (const auto& [v, _] : g.initializers) constant[v] = 1;
  for (const Node& n : g.nodes)
    if (is_constant(n))
      for (ValueId v : n.outputs)
        if (v != kNoValue) constant[v] = 1;

  // 1. Host nodes, in topological order: Shape/Size always; a host-computable op when every input
  //    is a host value or a small constant and every output is small.
  std::vector<char> host(g.num_values(), 0), node_host(num_nodes, 0);
  for (size_t k = 0; k < num_nodes; ++k) {
    const Node& n = g.nodes[k];
    bool on_host = reads_metadata_only(n);
    if (!on_host && op_traits(n).host_computable) {
      on_host = !n.inputs.empty();
      for (ValueId v : n.inputs)
        if (v != kNoValue && !host[v] && !(constant[v] && is_small(g, v))) on_host = false;
      for (ValueId v : n.outputs)
        if (v != kNoValue && !is_small(g, v)) on_host = false;
    }
    if (!on_host) {
      for (int i : host_outputs(n))
        if (n.outputs[i] != kNoValue) host[n.outputs[i]] = 1;
      continue;
    }
    node_host[k] = 1;
    for (ValueId v : n.outputs)
      if (v != kNoValue) host[v] = 1;
  }

  // 2. What each reader needs of each value: a host node's inputs and every host input are read
  //    on the host; Shape/Size read anything; the rest is read on the device, as are graph
  //    outputs and device_roots (after the last node of their phase).
  auto need_of = [&](NodeId reader, int pos) {
    const Node& n = g.nodes[reader];
    if (reads_metadata_only(n)) return Need::kAny;
    if (node_host[reader]) return Need::kHost;
    const std::vector<int> hi = host_inputs(n);
    return std::binary_search(hi.begin(), hi.end(), pos) ? Need::kHost : Need::kDevice;
  };

  // 3. Constants: on the side their readers are; a constant read on both sides gets a host copy.
  //    A Constant node's copy is a clone of the node, inserted right after it.
  std::vector<std::vector<Node>> after(num_nodes);  // new nodes to insert after node k
  std::vector<std::vector<Node>> before(num_nodes + 1);  // ... before node k (k == size: at the end)
  auto rewire = [&](NodeId reader, ValueId from, ValueId to, Need need) {
    Node& n = g.nodes[reader];
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (n.inputs[i] == from && need_of(reader, static_cast<int>(i)) == need) n.inputs[i] = to;
  };
  std::vector<char> is_output(g.num_values(), 0);
  for (ValueId v : g.outputs) is_output[v] = 1;
  if (device_roots)
    for (ValueId v : *device_roots)
      if (v != kNoValue) is_output[v] = 1;
  const ValueId original_values = g.num_values();  // values added below need no placing
  for (ValueId v = 0; v < original_values; ++v) {
    if (!constant[v]) continue;
    bool on_host = false, on_device = is_output[v] != 0;
    for (NodeId r : idx.consumers[v])
      for (size_t i = 0; i < g.nodes[r].inputs.size(); ++i) {
        if (g.nodes[r].inputs[i] != v) continue;
        const Need need = need_of(r, static_cast<int>(i));
        on_host |= need == Need::kHost;
        on_device |= need == Need::kDevice;
      }
    if (!on_host) continue;
    if (!on_device) {
      host[v] = 1;
      continue;
    }
    const Value info = g.value(v);  // a copy: new_value may grow the value table
    const ValueId copy = g.new_value(info.name + "/host", info.dtype, info.shape);
    host.push_back(1);
    if (auto it = g.initializers.find(v); it != g.initializers.end()) {
      const TensorData data = it->second;
      g.initializers.emplace(copy, data);
    } else {
      const NodeId p = idx.producer[v];
      Node clone = g.nodes[p];
      clone.name = g.unique_node_name(clone.name + "/host");
      clone.outputs = {copy};
      after[p].push_back(std::move(clone));
    }
    for (NodeId r : idx.consumers[v]) rewire(r, v, copy, Need::kHost);
  }

  // 4. Every other crossing: one transfer per (value, direction, phase), before its first reader
  //    in that phase. Readers are visited in node order, so the first one met is the first.
  Placement p;
  std::map<std::tuple<ValueId, bool, bool>, ValueId> made;  // (value, to host, in backward) -> copy
  std::vector<char> uploaded(g.num_values(), 0);
  auto transfer = [&](ValueId v, bool to_host, bool in_backward, size_t at) {
    const auto key = std::make_tuple(v, to_host, in_backward);
    if (auto it = made.find(key); it != made.end()) return it->second;
    const Value info = g.value(v);
    const ValueId out = g.new_value(info.name + (to_host ? "/to_host" : "/to_device"), info.dtype, info.shape);
    host.push_back(to_host);
    uploaded.resize(g.num_values(), 0);
    uploaded[out] = !to_host;
    Node t;
    t.domain = kOurDomain;
    t.op_type = to_host ? kToHost : kToDevice;
    t.name = g.unique_node_name(std::string(to_host ? "ToHost/" : "ToDevice/") + info.name);
    t.inputs = {v};
    t.outputs = {out};
    t.in_backward = in_backward;
    before[at].push_back(std::move(t));
    ++(to_host ? p.to_host : p.to_device);
    return made[key] = out;
  };
  for (size_t k = 0; k < num_nodes; ++k) {
    Node& n = g.nodes[k];
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId v = n.inputs[i];
      if (v == kNoValue || (v < original_values && constant[v])) continue;
      const Need need = need_of(static_cast<NodeId>(k), static_cast<int>(i));
      if (need == Need::kAny || (need == Need::kHost) == (host[v] != 0)) continue;
      n.inputs[i] = transfer(v, need == Need::kHost, n.in_backward, k);
    }
  }
  // Graph outputs end the forward phase, device_roots the last phase.
  size_t forward_end = 0;
  while (forward_end < num_nodes && !g.nodes[forward_end].in_backward) ++forward_end;
  for (ValueId& v : g.outputs)
    if (v != kNoValue && host[v]) v = transfer(v, false, false, forward_end);
  if (device_roots) {
    const bool backward = forward_end < num_nodes;
    for (ValueId& v : *device_roots)
      if (v != kNoValue && host[v]) v = transfer(v, false, backward, num_nodes);
  }

  // 5. The rewritten node list, and the placement of every node in it.
  std::vector<Node> nodes;
  nodes.reserve(num_nodes + p.to_host + p.to_device);
  std::vector<char> on_host;
  auto emit = [&](Node n, bool computes_on_host) {
    nodes.push_back(std::move(n));
    on_host.push_back(computes_on_host);
    p.host_nodes += computes_on_host;
  };
  for (size_t k = 0; k <= num_nodes; ++k) {
    for (Node& t : before[k]) emit(std::move(t), false);  // transfers run on the run's device
    if (k == num_nodes) break;
    emit(std::move(g.nodes[k]), node_host[k] != 0);
    for (Node& c : after[k]) emit(std::move(c), true);  // a Constant's host copy
  }
  g.nodes = std::move(nodes);
  p.host = std::move(host);
  p.host.resize(g.num_values(), 0);
  p.uploaded = std::move(uploaded);
  p.uploaded.resize(g.num_values(), 0);
  p.node_on_host = std::move(on_host);
  return p;
}

}  // namespace torch_ort
