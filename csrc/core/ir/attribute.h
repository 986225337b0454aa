// Node attributes and constant tensor data, as carried by ONNX nodes and initializers.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "csrc/core/ir/dtype.h"

namespace torch_ort {

// A constant tensor (initializer, Constant node value, tensor attribute). Raw little-endian bytes.
struct TensorData {
  DType dtype = DType::kUndefined;
  std::vector<int64_t> dims;
  std::string raw;  // dtype_size(dtype) * numel bytes

  int64_t numel() const;
  // Values as int64 (for int32/int64 data, e.g. shape or axes constants). Throws on other dtypes.
  std::vector<int64_t> as_int64s() const;
  // Values as double, for any numeric dtype (constant folding, reference evaluation).
  // Throws std::invalid_argument for string/complex/undefined.
  std::vector<double> as_doubles() const;
  static TensorData from_int64s(const std::vector<int64_t>& v, bool scalar = false);
  static TensorData scalar_float(DType dtype, double v);  // float/double/float16/bfloat16
};

using Attribute = std::variant<int64_t, float, std::string, TensorData, std::vector<int64_t>,
                               std::vector<float>, std::vector<std::string>>;

class Attributes {
 public:
  bool has(const std::string& name) const { return map_.count(name) != 0; }
  void set(const std::string& name, Attribute a) { map_[name] = std::move(a); }
  void erase(const std::string& name) { map_.erase(name); }
  // Typed getters: return the default when absent; throw (naming the attribute) on a wrong type.
  int64_t get_int(const std::string& name, int64_t dflt) const;
  float get_float(const std::string& name, float dflt) const;
  std::string get_string(const std::string& name, const std::string& dflt) const;
  std::vector<int64_t> get_ints(const std::string& name, const std::vector<int64_t>& dflt) const;
  const TensorData* get_tensor(const std::string& name) const;  // nullptr when absent
  std::vector<float> get_floats(const std::string& name, const std::vector<float>& dflt) const;
  std::vector<std::string> get_strings(const std::string& name,
                                       const std::vector<std::string>& dflt) const;
  const std::map<std::string, Attribute>& all() const { return map_; }
  bool operator==(const Attributes& o) const { return map_ == o.map_; }

 private:
  std::map<std::string, Attribute> map_;  // ordered: deterministic export and printing
};

bool operator==(const TensorData& a, const TensorData& b);
// "int", "float", "string", "tensor", "ints", "floats", "strings" (for error messages).
const char* attribute_kind_name(const Attribute& a);

}  // namespace torch_ort
