// Limits on model input, in one place. Model bytes may come from disk (ORTMODULE_CACHE_DIR) or be
// hostile: every count, size and shape taken from them is bounded here before anything allocates
// or loops on it, and shape arithmetic on them is overflow-checked. The values are generous (a
// GPT-2-XL or 70B-LLM training graph is far inside each); docs/hardening.md lists them.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace torch_ort {

struct Shape;

namespace limits {

// protobuf parses at most INT_MAX bytes (2 GiB - 1) as one message; ONNX puts bigger weights in
// external data (which torch_ort refuses: ORTModule binds parameters as graph inputs instead).
inline constexpr int64_t kMaxModelBytes = (int64_t{1} << 31) - 1;
// GPT-2-XL exports ~5k nodes, an 80-layer LLM ~10k; 100x headroom for unrolled or ATen-heavy graphs.
inline constexpr int64_t kMaxNodes = 1'000'000;
// Memory the parsed ModelProto would take, estimated from the wire bytes before protobuf parses
// them (csrc/core/ir/onnx_prescan.cc: each message its generated class's size, each string 64 B
// plus its bytes, ...): parsing amplifies (an empty NodeProto is 2 bytes on the wire, ~200 parsed),
// so kMaxModelBytes alone would let 2 GiB of bytes grow to ~200 GiB. Real training graphs cost
// 1-3 KB per node, value_info included (~12x their bytes; the graphs in tests/fuzz/corpus, where
// the estimate is 1.1-1.6x what parsing allocates): a graph at kMaxNodes, ~2 GB, fits with 2x to
// spare, and hostile bytes stop before protobuf allocates more than 4 GiB.
inline constexpr int64_t kMaxParsedBytes = int64_t{4} << 30;
// Values (inputs, initializers, node outputs) and value_info/output entries; nodes have ~1-3 each.
inline constexpr int64_t kMaxValues = 4'000'000;
// NumPy 2 allows 64 dims and torch kernels 25; real models stay under 8.
inline constexpr int64_t kMaxRank = 64;
// A single known dim: 2^48 (~2.8e14) elements is ~1000x the largest device memory; also keeps
// dtype size x numel (<= 2^52) and sums of many of them far from int64 overflow.
inline constexpr int64_t kMaxDim = int64_t{1} << 48;
// Static element count (product of the known dims) of a value, initializer or inferred shape.
inline constexpr int64_t kMaxElements = int64_t{1} << 48;
// Decoded constant data (initializers and tensor attributes, all together): as raw_data they
// must fit in one 2 GiB message; typed fields (varints) could otherwise expand it up to 8x.
inline constexpr int64_t kMaxConstantBytes = int64_t{2} << 30;
// Entries of an ints/floats/strings attribute: real ones are a few hundred at most (a Constant's
// value_ints); large constants travel as tensors.
inline constexpr int64_t kMaxAttributeElements = int64_t{1} << 20;
// Bytes of one string attribute (or one entry of a strings attribute): modes, names, equations.
inline constexpr int64_t kMaxAttributeStringBytes = int64_t{1} << 20;
// Entries of a per-axis attribute (perm, axes, pads, strides, kernel_shape, ...): pads has 2 per axis.
inline constexpr int64_t kMaxShapeAttributeElements = 2 * kMaxRank;
// Bytes of a symbolic dim's name (dim_param): the exporter writes "s0" or "48 - 2*s20". A longer
// one (a long sympy sum over many dynamic inputs) is imported as an unknown dim, never parsed; the
// parser recurses on parentheses, so this also bounds its depth.
inline constexpr int64_t kMaxSymbolBytes = 1024;

// "123, over the limit kMaxRank = 64" — the tail of every limit error message.
inline std::string over(int64_t value, const char* limit_name, int64_t limit) {
  return std::to_string(value) + ", over the limit " + limit_name + " = " + std::to_string(limit) +
         " (see 'Limits on model input' in docs/hardening.md)";
}

// Product of `dims` when every one is in [0, kMaxDim] and the product is at most kMaxElements;
// otherwise nullopt and `why` says which (for the caller to wrap in its own error type).
std::optional<int64_t> bounded_numel(const std::vector<int64_t>& dims, std::string* why);

// The problem with a shape's known part (rank, a dim, the product of the known dims), or "" when
// it is within the limits. Symbolic and unknown dims are not counted.
std::string check_shape(const Shape& s);

}  // namespace limits

// Checked int64 arithmetic for shape math: throws std::overflow_error naming `what`. Shape
// inference turns it into an unknown dim (run_shape_rule); elsewhere it surfaces as an error.
inline int64_t checked_add(int64_t a, int64_t b, const char* what = "shape arithmetic") {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    throw std::overflow_error(std::string(what) + ": " + std::to_string(a) + " + " +
                              std::to_string(b) + " overflows int64");
  return r;
}
inline int64_t checked_sub(int64_t a, int64_t b, const char* what = "shape arithmetic") {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r))
    throw std::overflow_error(std::string(what) + ": " + std::to_string(a) + " - " +
                              std::to_string(b) + " overflows int64");
  return r;
}
inline int64_t checked_mul(int64_t a, int64_t b, const char* what = "shape arithmetic") {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    throw std::overflow_error(std::string(what) + ": " + std::to_string(a) + " * " +
                              std::to_string(b) + " overflows int64");
  return r;
}

}  // namespace torch_ort
