// ONNX ModelProto <-> IR, through protobuf classes generated from the onnx package's own
// onnx.proto under a private package name (so we never clash with another onnx.proto in-process).
#pragma once

#include <string>

#include "csrc/core/ir/graph.h"

namespace torch_ort {

// Parses serialized ModelProto bytes. Throws OnnxImportError with a message that names the
// problem (bad bytes, unsupported attribute kind, a node input that names no value, ...).
// Initializers become graph initializers (constants); callers move parameters to inputs.
Graph import_onnx(const std::string& bytes);
// Serializes the graph (values' dtypes/shapes as value_info, initializers with their data).
std::string export_onnx(const Graph& g);

}  // namespace torch_ort
