// Placement: which values live on the host and which on the run's device, decided once per plan.
//
// Shape metadata and scalar control values — Shape/Size outputs, the arithmetic over them, small
// constants, the shape/axes/starts/repeats inputs of Reshape, Expand, Slice, Tile, Unsqueeze and
// the like, Dropout's ratio and training flag — live on the host: their nodes compute on the
// CPU, and the kernels that read them as numbers (KernelCtx::input_ints) never wait for a
// device→host copy. A step on a GPU then never synchronizes with the host. ONNX Runtime declares
// such inputs in its kernel definitions (host-memory inputs); here one table does it for all
// kernels (host_inputs), and the runtime refuses a host read the table does not declare.
//
// Where a value crosses, place_host_values makes the crossing explicit with a node of ours:
//   ToHost(x)   a device value read at a host input: one device→host copy per run (counted by
//               the engine as a host read, on every device; a well-placed model has none);
//   ToDevice(x) a host value read as data by a device node: uploaded once and cached by the
//               runtime while its values stay the same (shapes rarely change).
// Constants read on both sides are duplicated instead (one copy per side, no transfer).
#pragma once

#include <cstdint>
#include <vector>

#include "csrc/core/ir/graph.h"

namespace torch_ort {

inline constexpr const char* kToHost = "ToHost";
inline constexpr const char* kToDevice = "ToDevice";

// Host values are tiny: a node computes on the host only when each output has a static size of
// at most this many elements (a shape of rank 8 and its arithmetic fit many times over).
inline constexpr int64_t kMaxHostElements = 64;

// Input positions of node `n` its kernel reads as numbers on the host (shape, axes, starts,
// repeats, ratio, training flag, Range bounds, ATenOp arguments traced from sizes): the op's
// host_inputs trait (csrc/core/ops/<family>.cc, one line per op), or per node for ConcatGrad and
// ATenOp. The runtime checks every host read against it.
std::vector<int> host_inputs(const Node& n);
// Output positions a device kernel makes on the host (Attention's backend choice, a scalar its
// gradient reads as a number).
std::vector<int> host_outputs(const Node& n);

// The placement of every value and node of a graph, after place_host_values rewrote it.
struct Placement {
  std::vector<char> host;      // per value: lives in host memory
  std::vector<char> uploaded;  // per value: a ToDevice output (device memory the runtime caches)
  std::vector<char> node_on_host;  // per node: computes on the host
  int64_t host_nodes = 0;      // nodes computing on the host
  int64_t to_host = 0;         // ToHost nodes (device→host reads per forward+backward)
  int64_t to_device = 0;       // ToDevice nodes

  // Queries that are false for a default-constructed (empty) placement: everything on the device.
  bool on_host(ValueId v) const { return v >= 0 && v < static_cast<ValueId>(host.size()) && host[v]; }
  bool is_upload(ValueId v) const {
    return v >= 0 && v < static_cast<ValueId>(uploaded.size()) && uploaded[v];
  }
  bool computes_on_host(NodeId n) const {
    return n >= 0 && n < static_cast<NodeId>(node_on_host.size()) && node_on_host[n];
  }
};

// Decides where every value of `g` lives and makes each crossing a ToHost/ToDevice node placed
// just before its first reader in that reader's phase (Node::in_backward), so the forward and
// backward ranges of a training graph stay contiguous. Graph inputs (the caller's tensors) live
// on the device; graph outputs and the values in `device_roots` (a training graph's input
// gradients) must end there: a host one gets a ToDevice and the entry is replaced by its output.
// Keeps topological order; runs after every pass, autodiff and recompute, right before planning.
Placement place_host_values(Graph& g, std::vector<ValueId>* device_roots = nullptr);

}  // namespace torch_ort
