// The one registry template behind every per-op table filled at static init: shape rules
// (shapes/shape_rules.h), gradient rules (autodiff/gradient_registry.h) and kernels
// (runtime/kernel.h). Keyed by "domain::op_type", the default domain "" as the importer writes it;
// a second registration of an op is a programming error, raised at load time.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace torch_ort {

template <typename Entry>
class OpRegistry {
 public:
  explicit OpRegistry(const char* what) : what_(what) {}
  OpRegistry(const OpRegistry&) = delete;
  OpRegistry& operator=(const OpRegistry&) = delete;

  // Returns true, so that a registration can initialise a static bool (the REGISTER_* macros).
  bool add(const std::string& domain, const std::string& op, Entry entry) {
    const std::string key = domain + "::" + op;
    if (!entries_.emplace(key, std::move(entry)).second)
      throw std::logic_error(std::string(what_) + " for '" + key + "' registered twice");
    return true;
  }

  // The entry of op in domain, nullptr for none.
  const Entry* entry(const std::string& domain, const std::string& op) const {
    auto it = entries_.find(domain + "::" + op);
    return it == entries_.end() ? nullptr : &it->second;
  }

  // "domain::op" of every entry, sorted ("::MatMul", "com.torch_ort::ReluGrad"): coverage tests.
  std::vector<std::string> ops() const {
    std::vector<std::string> out;
    for (const auto& [key, _] : entries_) out.push_back(key);
    return out;
  }

 private:
  const char* what_;
  std::map<std::string, Entry> entries_;
};

}  // namespace torch_ort
