// Constant tensor helpers (int/float views, scalar builders) and typed attribute getters.
#include "csrc/core/ir/attribute.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace torch_ort {

// Raw tensor bytes are little-endian (ONNX raw_data); we memcpy them as host values.
static_assert(std::endian::native == std::endian::little, "torch_ort assumes a little-endian host");

namespace {

// IEEE binary16 with round-to-nearest-even, so that scalar constants match torch's .half().
uint16_t float_to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xffu);
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (e <= 0) {                                                  // half subnormal or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | h);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t float_to_bfloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7fc0u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);  // nearest-even
}

float bfloat16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

template <typename T>
T load(const std::string& raw, int64_t i) {
  T v;
  std::memcpy(&v, raw.data() + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

template <typename T>
void append(std::string& raw, T v) {
  raw.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

}  // namespace

int64_t TensorData::numel() const {
  // The importer bounds dims (limits.h); a tensor built otherwise must not wrap around either.
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n))
      throw std::overflow_error("a constant tensor's element count overflows int64 (or a dim is negative)");
  }
  return n;
}

std::vector<int64_t> TensorData::as_int64s() const {
  const int64_t n = numel();
  std::vector<int64_t> out(static_cast<size_t>(n));
  if (dtype == DType::kInt64) {
    for (int64_t i = 0; i < n; ++i) out[i] = load<int64_t>(raw, i);
  } else if (dtype == DType::kInt32) {
    for (int64_t i = 0; i < n; ++i) out[i] = load<int32_t>(raw, i);
  } else {
    throw std::invalid_argument("as_int64s: expected an int32/int64 tensor, got " +
                                std::string(dtype_name(dtype)));
  }
  return out;
}

std::vector<double> TensorData::as_doubles() const {
  const int64_t n = numel();
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kFloat: out[i] = load<float>(raw, i); break;
      case DType::kDouble: out[i] = load<double>(raw, i); break;
      case DType::kFloat16: out[i] = half_to_float(load<uint16_t>(raw, i)); break;
      case DType::kBFloat16: out[i] = bfloat16_to_float(load<uint16_t>(raw, i)); break;
      case DType::kInt64: out[i] = static_cast<double>(load<int64_t>(raw, i)); break;
      case DType::kInt32: out[i] = load<int32_t>(raw, i); break;
      case DType::kInt16: out[i] = load<int16_t>(raw, i); break;
      case DType::kInt8: out[i] = load<int8_t>(raw, i); break;
      case DType::kUInt8: case DType::kBool: out[i] = load<uint8_t>(raw, i); break;
      case DType::kUInt16: out[i] = load<uint16_t>(raw, i); break;
      case DType::kUInt32: out[i] = load<uint32_t>(raw, i); break;
      case DType::kUInt64: out[i] = static_cast<double>(load<uint64_t>(raw, i)); break;
      default:
        throw std::invalid_argument("as_doubles: a " + std::string(dtype_name(dtype)) +
                                    " tensor has no real-number view");
    }
  }
  return out;
}

TensorData TensorData::from_int64s(const std::vector<int64_t>& v, bool scalar) {
  if (scalar && v.size() != 1) {
    throw std::invalid_argument("from_int64s: a scalar needs exactly 1 value, got " +
                                std::to_string(v.size()));
  }
  TensorData t;
  t.dtype = DType::kInt64;
  if (!scalar) t.dims = {static_cast<int64_t>(v.size())};
  for (int64_t x : v) append(t.raw, x);
  return t;
}

TensorData TensorData::scalar_float(DType dtype, double v) {
  TensorData t;
  t.dtype = dtype;  // dims stay empty: a rank-0 tensor
  switch (dtype) {
    case DType::kFloat: append(t.raw, static_cast<float>(v)); break;
    case DType::kDouble: append(t.raw, v); break;
    case DType::kFloat16: append(t.raw, float_to_half(static_cast<float>(v))); break;
    case DType::kBFloat16: append(t.raw, float_to_bfloat16(static_cast<float>(v))); break;
    default:
      throw std::invalid_argument("scalar_float: " + std::string(dtype_name(dtype)) +
                                  " is not a floating dtype");
  }
  return t;
}

bool operator==(const TensorData& a, const TensorData& b) {
  return a.dtype == b.dtype && a.dims == b.dims && a.raw == b.raw;
}

const char* attribute_kind_name(const Attribute& a) {
  static constexpr const char* kNames[] = {"int",    "float",  "string", "tensor",
                                           "ints",   "floats", "strings"};
  return kNames[a.index()];
}

namespace {

// Looks up `name` and returns a pointer to its T payload, nullptr when absent.
template <typename T>
const T* typed(const std::map<std::string, Attribute>& m, const std::string& name,
               const char* expected) {
  auto it = m.find(name);
  if (it == m.end()) return nullptr;
  if (const T* v = std::get_if<T>(&it->second)) return v;
  throw std::invalid_argument("attribute '" + name + "' is of kind " +
                              attribute_kind_name(it->second) + ", expected " + expected);
}

}  // namespace

int64_t Attributes::get_int(const std::string& name, int64_t dflt) const {
  const int64_t* v = typed<int64_t>(map_, name, "int");
  return v ? *v : dflt;
}

float Attributes::get_float(const std::string& name, float dflt) const {
  const float* v = typed<float>(map_, name, "float");
  return v ? *v : dflt;
}

std::string Attributes::get_string(const std::string& name, const std::string& dflt) const {
  const std::string* v = typed<std::string>(map_, name, "string");
  return v ? *v : dflt;
}

std::vector<int64_t> Attributes::get_ints(const std::string& name,
                                          const std::vector<int64_t>& dflt) const {
  const auto* v = typed<std::vector<int64_t>>(map_, name, "ints");
  return v ? *v : dflt;
}

std::vector<float> Attributes::get_floats(const std::string& name,
                                          const std::vector<float>& dflt) const {
  const auto* v = typed<std::vector<float>>(map_, name, "floats");
  return v ? *v : dflt;
}

std::vector<std::string> Attributes::get_strings(const std::string& name,
                                                 const std::vector<std::string>& dflt) const {
  const auto* v = typed<std::vector<std::string>>(map_, name, "strings");
  return v ? *v : dflt;
}

const TensorData* Attributes::get_tensor(const std::string& name) const {
  return typed<TensorData>(map_, name, "tensor");
}

}  // namespace torch_ort
