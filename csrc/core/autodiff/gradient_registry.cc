// The process-wide table of gradient rules, filled by REGISTER_GRADIENT lines at static init.
#include "csrc/core/autodiff/gradient_registry.h"

#include <stdexcept>

namespace torch_ort {

GradientRegistry& GradientRegistry::instance() {
  static GradientRegistry r;  // function-local: safe under any static-init order
  return r;
}

bool GradientRegistry::add(const std::string& domain, const std::string& op, GradientEntry entry) {
  const std::string key = domain + "::" + op;
  if (!entries_.emplace(key, std::move(entry)).second)
    throw std::logic_error("gradient for '" + key + "' registered twice");
  return true;
}

const GradientEntry* GradientRegistry::find(const std::string& domain, const std::string& op) const {
  auto it = entries_.find(domain + "::" + op);  // the default domain is "" (the importer's)
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<std::string> GradientRegistry::ops() const {
  std::vector<std::string> out;
  for (const auto& [k, _] : entries_) out.push_back(k);
  return out;
}

}  // namespace torch_ort
