// ModelProto wire bytes -> what parsing them would allocate, before protobuf allocates it.
// Field numbers are those of build/generated/torch_ort_onnx.proto (the onnx package's onnx.proto,
// see scripts/build_protobuf.py); the costs use the generated classes' own sizes.
#include "csrc/core/ir/onnx_prescan.h"

#include <cstdint>
#include <string>

#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/limits.h"
#include "torch_ort_onnx.pb.h"

namespace torch_ort {

namespace {

namespace pb = ::torch_ort_onnx;

// protobuf's default recursion limit: the parser refuses deeper nesting anyway; the walk stops
// there so that its own recursion (one small frame per level) is bounded too.
constexpr int kMaxNesting = 100;

// Cost model, per object the parser creates: a heap block (malloc header and rounding) and, in a
// repeated field, a pointer slot in an array that grows by doubling (up to 2 slots per element).
constexpr int64_t kBlock = 16;
constexpr int64_t kSlot = 16;

enum M : uint8_t {  // the messages of onnx.proto
  kModel, kGraph, kNode, kAttribute, kTensor, kSegment, kSparseTensor, kValueInfo, kType,
  kTypeTensor, kTypeSequence, kTypeMap, kTypeOptional, kTypeSparseTensor, kTypeOpaque, kShape,
  kDim, kStringPair, kOpset, kFunction, kTrainingInfo, kTensorAnnotation, kDeviceConfig,
  kNodeDeviceConfig, kShardingSpec, kShardedDim, kSimpleShardedDim, kIntIntList, kNumMessages
};

enum class Kind : uint8_t {
  kMessage,   // singular or repeated embedded message (`child`)
  kString,    // string or bytes, singular or repeated: a std::string each
  kVarint,    // singular int/enum/bool: inside its message, costs nothing
  kFixed32,   // singular float: likewise
  kVarints4,  // repeated int32: 4 bytes per element, packed or not
  kVarints8,  // repeated int64/uint64
  kFloats,    // repeated float (fixed32)
  kDoubles,   // repeated double (fixed64)
};

struct Field {
  int number;
  Kind kind;
  M child = kNumMessages;  // for kMessage
};

struct Schema {
  int64_t size;  // sizeof the generated class
  const Field* fields;
  int num_fields;
};

constexpr Kind S = Kind::kString, V = Kind::kVarint, Msg = Kind::kMessage;

// One line per message; a field not listed (or with another wire type) is an unknown field, kept
// by the parser as bytes and costed as such.
constexpr Field kModelF[] = {{1, V}, {2, S}, {3, S}, {4, S}, {5, V}, {6, S}, {7, Msg, kGraph},
                             {8, Msg, kOpset}, {14, Msg, kStringPair}, {20, Msg, kTrainingInfo},
                             {25, Msg, kFunction}, {26, Msg, kDeviceConfig}};
constexpr Field kGraphF[] = {{1, Msg, kNode}, {2, S}, {5, Msg, kTensor}, {15, Msg, kSparseTensor},
                             {10, S}, {11, Msg, kValueInfo}, {12, Msg, kValueInfo},
                             {13, Msg, kValueInfo}, {14, Msg, kTensorAnnotation},
                             {16, Msg, kStringPair}};
constexpr Field kNodeF[] = {{1, S}, {2, S}, {3, S}, {4, S}, {7, S}, {8, S}, {5, Msg, kAttribute},
                            {6, S}, {9, Msg, kStringPair}, {10, Msg, kNodeDeviceConfig}};
constexpr Field kAttributeF[] = {
    {1, S}, {21, S}, {13, S}, {20, V}, {2, Kind::kFixed32}, {3, V}, {4, S}, {5, Msg, kTensor},
    {6, Msg, kGraph}, {22, Msg, kSparseTensor}, {14, Msg, kType}, {7, Kind::kFloats},
    {8, Kind::kVarints8}, {9, S}, {10, Msg, kTensor}, {11, Msg, kGraph},
    {23, Msg, kSparseTensor}, {15, Msg, kType}};
constexpr Field kTensorF[] = {
    {1, Kind::kVarints8}, {2, V}, {3, Msg, kSegment}, {4, Kind::kFloats}, {5, Kind::kVarints4},
    {6, S}, {7, Kind::kVarints8}, {8, S}, {12, S}, {9, S}, {13, Msg, kStringPair}, {14, V},
    {10, Kind::kDoubles}, {11, Kind::kVarints8}, {16, Msg, kStringPair}};
constexpr Field kSegmentF[] = {{1, V}, {2, V}};
constexpr Field kSparseTensorF[] = {{1, Msg, kTensor}, {2, Msg, kTensor}, {3, Kind::kVarints8}};
constexpr Field kValueInfoF[] = {{1, S}, {2, Msg, kType}, {3, S}, {4, Msg, kStringPair}};
constexpr Field kTypeF[] = {{1, Msg, kTypeTensor}, {4, Msg, kTypeSequence}, {5, Msg, kTypeMap},
                            {9, Msg, kTypeOptional}, {8, Msg, kTypeSparseTensor},
                            {7, Msg, kTypeOpaque}, {6, S}};
constexpr Field kTypeTensorF[] = {{1, V}, {2, Msg, kShape}};
constexpr Field kTypeElemF[] = {{1, Msg, kType}};  // Sequence, Optional
constexpr Field kTypeMapF[] = {{1, V}, {2, Msg, kType}};
constexpr Field kTypeOpaqueF[] = {{1, S}, {2, S}};
constexpr Field kShapeF[] = {{1, Msg, kDim}};
constexpr Field kDimF[] = {{1, V}, {2, S}, {3, S}};
constexpr Field kStringPairF[] = {{1, S}, {2, S}};
constexpr Field kOpsetF[] = {{1, S}, {2, V}};
constexpr Field kFunctionF[] = {{1, S}, {4, S}, {5, S}, {6, S}, {11, Msg, kAttribute},
                                {7, Msg, kNode}, {8, S}, {9, Msg, kOpset}, {10, S}, {13, S},
                                {12, Msg, kValueInfo}, {14, Msg, kStringPair}};
constexpr Field kTrainingInfoF[] = {{1, Msg, kGraph}, {2, Msg, kGraph}, {3, Msg, kStringPair},
                                    {4, Msg, kStringPair}};
constexpr Field kTensorAnnotationF[] = {{1, S}, {2, Msg, kStringPair}};
constexpr Field kDeviceConfigF[] = {{1, S}, {2, V}, {3, S}};
constexpr Field kNodeDeviceConfigF[] = {{1, S}, {2, Msg, kShardingSpec}, {3, V}};
constexpr Field kShardingSpecF[] = {{1, S}, {2, Kind::kVarints8}, {3, Msg, kIntIntList},
                                    {4, Msg, kShardedDim}};
constexpr Field kShardedDimF[] = {{1, V}, {2, Msg, kSimpleShardedDim}};
constexpr Field kSimpleShardedDimF[] = {{1, V}, {2, S}, {3, V}};
constexpr Field kIntIntListF[] = {{1, V}, {2, Kind::kVarints8}};

#define TORCH_ORT_SCHEMA(T, F) {static_cast<int64_t>(sizeof(pb::T)), F, sizeof(F) / sizeof(Field)}
const Schema kSchemas[kNumMessages] = {
    TORCH_ORT_SCHEMA(ModelProto, kModelF),
    TORCH_ORT_SCHEMA(GraphProto, kGraphF),
    TORCH_ORT_SCHEMA(NodeProto, kNodeF),
    TORCH_ORT_SCHEMA(AttributeProto, kAttributeF),
    TORCH_ORT_SCHEMA(TensorProto, kTensorF),
    TORCH_ORT_SCHEMA(TensorProto_Segment, kSegmentF),
    TORCH_ORT_SCHEMA(SparseTensorProto, kSparseTensorF),
    TORCH_ORT_SCHEMA(ValueInfoProto, kValueInfoF),
    TORCH_ORT_SCHEMA(TypeProto, kTypeF),
    TORCH_ORT_SCHEMA(TypeProto_Tensor, kTypeTensorF),
    TORCH_ORT_SCHEMA(TypeProto_Sequence, kTypeElemF),
    TORCH_ORT_SCHEMA(TypeProto_Map, kTypeMapF),
    TORCH_ORT_SCHEMA(TypeProto_Optional, kTypeElemF),
    TORCH_ORT_SCHEMA(TypeProto_SparseTensor, kTypeTensorF),
    TORCH_ORT_SCHEMA(TypeProto_Opaque, kTypeOpaqueF),
    TORCH_ORT_SCHEMA(TensorShapeProto, kShapeF),
    TORCH_ORT_SCHEMA(TensorShapeProto_Dimension, kDimF),
    TORCH_ORT_SCHEMA(StringStringEntryProto, kStringPairF),
    TORCH_ORT_SCHEMA(OperatorSetIdProto, kOpsetF),
    TORCH_ORT_SCHEMA(FunctionProto, kFunctionF),
    TORCH_ORT_SCHEMA(TrainingInfoProto, kTrainingInfoF),
    TORCH_ORT_SCHEMA(TensorAnnotation, kTensorAnnotationF),
    TORCH_ORT_SCHEMA(DeviceConfigurationProto, kDeviceConfigF),
    TORCH_ORT_SCHEMA(NodeDeviceConfigurationProto, kNodeDeviceConfigF),
    TORCH_ORT_SCHEMA(ShardingSpecProto, kShardingSpecF),
    TORCH_ORT_SCHEMA(ShardedDimProto, kShardedDimF),
    TORCH_ORT_SCHEMA(SimpleShardedDimProto, kSimpleShardedDimF),
    TORCH_ORT_SCHEMA(IntIntListEntryProto, kIntIntListF),
};
#undef TORCH_ORT_SCHEMA

constexpr int kWireVarint = 0, kWireFixed64 = 1, kWireBytes = 2, kWireStartGroup = 3,
              kWireEndGroup = 4, kWireFixed32 = 5;

// Thrown inside the walk for bytes the parser would refuse; prescan_model words the error.
struct Malformed {
  const char* why;
};

class Walker {
 public:
  explicit Walker(std::string_view bytes)
      : begin_(reinterpret_cast<const uint8_t*>(bytes.data())), end_(begin_ + bytes.size()) {}

  WireScan run() {
    scan_.parsed_bytes = kSchemas[kModel].size + kBlock;
    const uint8_t* p = begin_;
    message(kModel, p, end_, 0, /*main=*/true);
    return scan_;
  }
  int64_t offset(const uint8_t* p) const { return p - begin_; }
  const uint8_t* at = nullptr;  // where the walk stopped (for the error message)

 private:
  uint64_t varint(const uint8_t*& p, const uint8_t* end) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (p == end) { at = p; throw Malformed{"truncated varint"}; }
      const uint8_t b = *p++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;  // shift <= 63
      if (!(b & 0x80)) return v;
    }
    at = p;
    throw Malformed{"varint longer than 10 bytes"};
  }
  // A length-delimited payload: [p, returned end).
  const uint8_t* payload(const uint8_t*& p, const uint8_t* end) {
    const uint64_t len = varint(p, end);
    if (len > static_cast<uint64_t>(end - p)) { at = p; throw Malformed{"length past the end"}; }
    const uint8_t* stop = p + len;
    return stop;
  }
  // Skips one field of `wire` type after its tag; groups (a proto2 relic) nest until their end tag.
  void skip(int wire, uint32_t number, const uint8_t*& p, const uint8_t* end, int depth) {
    switch (wire) {
      case kWireVarint: varint(p, end); return;
      case kWireFixed64: case kWireFixed32: {
        const int64_t n = wire == kWireFixed64 ? 8 : 4;
        if (end - p < n) { at = p; throw Malformed{"truncated fixed-size field"}; }
        p += n;
        return;
      }
      case kWireBytes: p = payload(p, end); return;
      case kWireStartGroup: {
        if (depth + 1 > kMaxNesting) nesting(p);
        for (;;) {
          const uint64_t tag = varint(p, end);
          if ((tag & 7) == kWireEndGroup) {
            if ((tag >> 3) != number) { at = p; throw Malformed{"mismatched end-group tag"}; }
            return;
          }
          if (tag > UINT32_MAX || (tag >> 3) == 0 || (tag & 7) > kWireFixed32) {
            at = p;
            throw Malformed{"invalid tag"};
          }
          skip(static_cast<int>(tag & 7), static_cast<uint32_t>(tag >> 3), p, end, depth + 1);
        }
      }
      default: at = p; throw Malformed{"invalid wire type"};
    }
  }
  [[noreturn]] void nesting(const uint8_t* p) {
    throw OnnxImportError("the model nests messages more than " + std::to_string(kMaxNesting) +
                          " deep at byte " + std::to_string(offset(p)) +
                          " (subgraph attributes or types inside each other; protobuf's recursion "
                          "limit)");
  }
  // Elements of a repeated scalar field in one packed payload, or throws if it would not parse.
  int64_t packed_count(Kind kind, const uint8_t* p, const uint8_t* stop) {
    const int64_t len = stop - p;
    if (kind == Kind::kFloats || kind == Kind::kDoubles) {
      const int64_t width = kind == Kind::kFloats ? 4 : 8;
      if (len % width != 0) { at = p; throw Malformed{"packed fixed-size field of a partial element"}; }
      return len / width;
    }
    int64_t n = 0;
    for (const uint8_t* q = p; q != stop; ++q) n += (*q & 0x80) == 0;  // a varint ends per byte < 0x80
    if (len > 0 && (stop[-1] & 0x80)) { at = stop; throw Malformed{"truncated packed varint"}; }
    return n;
  }

  // Walks one message's fields in [p, end). `main`: this is the model or its graph, whose nodes
  // count against kMaxNodes (nodes of subgraphs and functions only count as memory).
  void message(M m, const uint8_t*& p, const uint8_t* end, int depth, bool main) {
    const Schema& schema = kSchemas[m];
    while (p != end) {
      const uint8_t* field_start = p;
      const uint64_t tag = varint(p, end);
      const int wire = static_cast<int>(tag & 7);
      if (tag > UINT32_MAX || (tag >> 3) == 0 || wire == kWireEndGroup || wire > kWireFixed32) {
        at = field_start;
        throw Malformed{"invalid tag"};
      }
      const int number = static_cast<int>(tag >> 3);
      const Field* f = nullptr;
      for (int i = 0; i < schema.num_fields; ++i)
        if (schema.fields[i].number == number) f = &schema.fields[i];
      if (f && charge_known(*f, wire, p, end, depth, main && m == kModel)) {
        if (main && m == kGraph && number == 1) ++scan_.graph_nodes;
        continue;
      }
      // Unknown (or known with another wire type): the parser keeps its bytes, in a string that
      // grows by doubling.
      skip(wire, static_cast<uint32_t>(number), p, end, depth);
      scan_.parsed_bytes += 2 * (p - field_start);
    }
  }
  // Costs and walks a schema field after its tag; false when its wire type makes it unknown.
  bool charge_known(const Field& f, int wire, const uint8_t*& p, const uint8_t* end, int depth,
                    bool child_main) {
    int64_t element = 0;  // bytes per element of a repeated scalar
    switch (f.kind) {
      case Kind::kMessage: {
        if (wire != kWireBytes) return false;
        const uint8_t* stop = payload(p, end);
        if (depth + 1 > kMaxNesting) nesting(p);
        scan_.parsed_bytes += kSchemas[f.child].size + kBlock + kSlot;
        message(f.child, p, stop, depth + 1, child_main && f.child == kGraph);
        return true;
      }
      case Kind::kString: {
        if (wire != kWireBytes) return false;
        const uint8_t* stop = payload(p, end);
        scan_.parsed_bytes += static_cast<int64_t>(sizeof(std::string)) + kBlock + kSlot + (stop - p);
        p = stop;
        return true;
      }
      case Kind::kVarint:
        if (wire != kWireVarint) return false;
        varint(p, end);
        return true;
      case Kind::kFixed32:
        if (wire != kWireFixed32) return false;
        skip(wire, 0, p, end, depth);
        return true;
      case Kind::kVarints4: case Kind::kFloats: element = 4; break;
      case Kind::kVarints8: case Kind::kDoubles: element = 8; break;
    }
    const int unpacked = f.kind == Kind::kFloats    ? kWireFixed32
                         : f.kind == Kind::kDoubles ? kWireFixed64
                                                    : kWireVarint;
    int64_t count = 1;
    if (wire == kWireBytes) {
      const uint8_t* stop = payload(p, end);
      count = packed_count(f.kind, p, stop);
      p = stop;
    } else if (wire == unpacked) {
      skip(wire, 0, p, end, depth);
    } else {
      return false;
    }
    scan_.parsed_bytes += 2 * element * count;  // a RepeatedField grows by doubling
    return true;
  }

  const uint8_t* begin_;
  const uint8_t* end_;
  WireScan scan_;
};

}  // namespace

WireScan prescan_model(std::string_view bytes) {
  Walker walker(bytes);
  WireScan scan;
  try {
    scan = walker.run();
  } catch (const Malformed& m) {
    throw OnnxImportError("not a valid ONNX ModelProto: " + std::to_string(bytes.size()) +
                          " bytes failed to parse (truncated or not an .onnx file?): " + m.why +
                          " at byte " + std::to_string(walker.offset(walker.at)));
  }
  if (scan.graph_nodes > limits::kMaxNodes) {
    throw OnnxImportError("the model's graph has " +
                          limits::over(scan.graph_nodes, "kMaxNodes", limits::kMaxNodes) + " nodes");
  }
  if (scan.parsed_bytes > limits::kMaxParsedBytes) {
    throw OnnxImportError("parsing the model would take about " +
                          limits::over(scan.parsed_bytes, "kMaxParsedBytes", limits::kMaxParsedBytes) +
                          " bytes of memory (" + std::to_string(bytes.size()) +
                          " bytes on the wire: many small messages or strings)");
  }
  return scan;
}

}  // namespace torch_ort
