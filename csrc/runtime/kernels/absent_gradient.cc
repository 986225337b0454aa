// absent_gradient (kernels/common.h): the zero gradient of an output nobody differentiated.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <map>
#include <mutex>
#include <tuple>

#include <ATen/ops/zeros.h>

#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

std::mutex g_mu;
// (dtype, device type, device index) -> a 0-dim zero, kept for the process.
std::map<std::tuple<int, int, int>, at::Tensor>& zeros() {
  static auto* z = new std::map<std::tuple<int, int, int>, at::Tensor>();  // never destroyed
  return *z;
}

std::tuple<int, int, int> key_of(c10::ScalarType t, c10::Device d) {
  return {static_cast<int>(t), static_cast<int>(d.type()), static_cast<int>(d.index())};
}

}  // namespace

at::Tensor absent_gradient(c10::IntArrayRef sizes, const at::TensorOptions& options) {
  const auto key = key_of(options.dtype().toScalarType(), options.device());
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = zeros().find(key);
  if (it == zeros().end()) it = zeros().emplace(key, at::zeros({}, options)).first;
  return it->second.expand(sizes);
}

bool is_absent_gradient(const at::Tensor& t) {
  if (!t.defined() || t.layout() != at::kStrided) return false;  // a sparse tensor has no storage
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = zeros().find(key_of(t.scalar_type(), t.device()));
  return it != zeros().end() && t.storage().unsafeGetStorageImpl() == it->second.storage().unsafeGetStorageImpl();
}

}  // namespace torch_ort::kernels
