// ONNX ModelProto <-> IR, through protobuf classes generated from the onnx package's own
// onnx.proto under a private package name (so we never clash with another onnx.proto in-process).
#pragma once

#include <string>
#include <string_view>

#include "csrc/core/ir/graph.h"

namespace torch_ort {

// Parses serialized ModelProto bytes. Throws OnnxImportError with a message that names the
// problem (bad bytes, unsupported attribute kind, a node input that names no value, ...).
// Initializers become graph initializers (constants); callers move parameters to inputs.
// Sizes and counts are bounded first (csrc/core/ir/limits.h): a view over more than
// kMaxModelBytes is refused before a byte of it is read.
Graph import_onnx(std::string_view bytes);
// Serializes the graph (values' dtypes/shapes as value_info, initializers with their data).
std::string export_onnx(const Graph& g);

}  // namespace torch_ort
