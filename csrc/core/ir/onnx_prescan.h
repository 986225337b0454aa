// A walk over ModelProto wire bytes before protobuf parses them: parsing amplifies memory (an
// empty NodeProto is 2 bytes on the wire and ~200 bytes parsed), so counts that bound memory are
// taken from the bytes themselves, in O(bytes) time and O(nesting) space.
#pragma once

#include <cstdint>
#include <string_view>

namespace torch_ort {

// What parsing the bytes as a ModelProto would build, read without building it.
struct WireScan {
  int64_t graph_nodes = 0;   // NodeProtos of the model's graph (ModelProto.graph.node)
  int64_t parsed_bytes = 0;  // estimated memory of the parsed ModelProto (limits::kMaxParsedBytes)
};

// Walks `bytes` along onnx.proto's schema (every message that can hold a message, a string or a
// repeated field). Throws OnnxImportError when the bytes would fail to parse, nest messages deeper
// than protobuf's recursion limit, or break kMaxNodes or kMaxParsedBytes.
WireScan prescan_model(std::string_view bytes);

}  // namespace torch_ort
