// The name -> CUDA function table of cuda_table.h.
#include "csrc/runtime/kernels/cuda_table.h"

#include <map>
#include <mutex>

namespace torch_ort {
namespace {

std::mutex& table_mu() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, void*>& table() {
  static std::map<std::string, void*> t;
  return t;
}

}  // namespace

void register_cuda_kernel(const char* name, void* fn) {
  std::lock_guard<std::mutex> lock(table_mu());
  table()[name] = fn;  // a re-import of _C_cuda registers the same pointers again
}

void* find_cuda_kernel(const std::string& name) {
  std::lock_guard<std::mutex> lock(table_mu());
  auto it = table().find(name);
  return it == table().end() ? nullptr : it->second;
}

std::vector<std::string> cuda_kernel_names() {
  std::lock_guard<std::mutex> lock(table_mu());
  std::vector<std::string> out;
  for (const auto& [name, fn] : table()) out.push_back(name);
  return out;
}

}  // namespace torch_ort
