// ATen glue of the CUDA multi-tensor kernels: checks the lists (multi_tensor.cc), groups the
// tensors by device and element types (one kernel instantiation per group), and launches
// multi_tensor.cu's kernels on the current stream of each device.
#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>

#include "csrc/runtime/errors.h"
#include "csrc/runtime/kernels/cuda/launch.h"
#include "csrc/runtime/kernels/multi_tensor.h"

namespace torch_ort::optim {
namespace {

cuda::Elem elem(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return cuda::Elem::kF32;
    case at::kHalf: return cuda::Elem::kF16;
    case at::kBFloat16: return cuda::Elem::kBF16;
    default: throw InputMismatchError("dtype " + std::string(c10::toString(t.scalar_type())) +
                                      " in a multi-tensor kernel; expected float32, float16 or bfloat16");
  }
}

struct Group {
  c10::Device device;
  cuda::Elem first, second;  // element types of lists 0 and 1 (1 == 0 for one list)
  cuda::Lists lists;
};

// Splits the call by (device, element type of list 0, of list 1), keeping the tensors' order.
std::vector<Group> groups_of(const std::vector<const std::vector<at::Tensor>*>& lists) {
  std::map<std::tuple<int, int, int>, size_t> where;
  std::vector<Group> out;
  const std::vector<at::Tensor>& first = *lists[0];
  for (size_t i = 0; i < first.size(); ++i) {
    const cuda::Elem a = elem(first[i]);
    const cuda::Elem b = lists.size() > 1 ? elem((*lists[1])[i]) : a;
    const auto key = std::make_tuple(int(first[i].device().index()), int(a), int(b));
    auto it = where.find(key);
    if (it == where.end()) {
      it = where.emplace(key, out.size()).first;
      out.push_back({first[i].device(), a, b, cuda::Lists{std::vector<std::vector<void*>>(lists.size()), {}}});
    }
    Group& g = out[it->second];
    for (size_t l = 0; l < lists.size(); ++l) g.lists.ptrs[l].push_back((*lists[l])[i].data_ptr());
    g.lists.numel.push_back(first[i].numel());
  }
  return out;
}

cudaStream_t stream_of(const c10::Device& d) { return at::cuda::getCurrentCUDAStream(d.index()).stream(); }

// A host int64 vector copied to `device`, ordered on `stream`. The host buffer is pageable, so
// the copy is staged before cudaMemcpyAsync returns and the vector may go right after.
at::Tensor upload(const std::vector<int64_t>& v, const c10::Device& device, cudaStream_t stream) {
  at::Tensor t = at::empty({int64_t(v.size())}, at::TensorOptions().dtype(at::kLong).device(device));
  const cudaError_t e = cudaMemcpyAsync(t.data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t),
                                        cudaMemcpyHostToDevice, stream);
  if (e != cudaSuccess) throw std::runtime_error(std::string("chunk offsets upload: ") + cudaGetErrorString(e));
  return t;
}

at::TensorOptions on(const c10::Device& device, at::ScalarType dtype) {
  return at::TensorOptions().dtype(dtype).device(device);
}

// The kernels' view of StepScalars, checked against the lists' device (CUDA kernels read them there).
cuda::DeviceScalars device_scalars(const char* call, const StepScalars& d, double grad_scale,
                                   const std::vector<at::Tensor>& params) {
  cuda::DeviceScalars out;
  if (params.empty()) return out;
  check_scalar(call, "scale_by", d.scale_by, at::kDouble, params[0].device());
  check_scalar(call, "skip", d.skip, at::kFloat, params[0].device());
  check_scalar(call, "step", d.step, at::kDouble, params[0].device());
  out.grad_scale = grad_scale;
  if (d.scale_by.defined()) out.scale_by = d.scale_by.data_ptr<double>();
  if (d.skip.defined()) out.skip = d.skip.data_ptr<float>();
  if (d.step.defined()) out.step = d.step.data_ptr<double>();
  return out;
}

template <typename Hyper>
cuda::DeviceScalars with_step(cuda::DeviceScalars out, const Hyper& h) {
  out.lr = h.lr;
  out.beta1 = h.beta1;
  out.beta2 = h.beta2;
  out.bias_correction = h.bias_correction;
  return out;
}

// Every list on one device: a step's device scalars live on one.
void check_one_device(const char* call, const std::vector<at::Tensor>& params) {
  for (const at::Tensor& p : params)
    if (p.device() != params[0].device())
      throw InputMismatchError(std::string(call) + ": tensors on " + params[0].device().str() + " and " +
                               p.device().str() + "; a step with device scalars runs on one device");
}

}  // namespace

void adam_cuda(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
               const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
               const AdamHyper& h) {
  check_lists("multi_tensor_adam", {&params, &grads, &exp_avgs, &exp_avg_sqs},
              {"params", "grads", "exp_avgs", "exp_avg_sqs"}, 2, c10::DeviceType::CUDA);
  check_grad_dtypes("multi_tensor_adam", params, grads);
  const AdamTerms t = adam_terms(h);
  const cuda::AdamArgs a{float(h.beta1), float(1.0 - h.beta1), float(h.beta2), float(1.0 - h.beta2),
                         float(h.eps), float(h.grad_scale), t.step_size, t.inv_sqrt_bc2, t.decay, t.l2,
                         int(h.mode)};
  for (const Group& g : groups_of({&params, &grads, &exp_avgs, &exp_avg_sqs})) {
    c10::cuda::CUDAGuard guard(g.device);
    cuda::adam(g.lists, g.first, g.second, a, stream_of(g.device));
  }
}

namespace {

void lamb_with(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
               const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
               const LambHyper& h, const cuda::DeviceScalars& dev) {
  check_lists("multi_tensor_lamb", {&params, &grads, &exp_avgs, &exp_avg_sqs},
              {"params", "grads", "exp_avgs", "exp_avg_sqs"}, 2, c10::DeviceType::CUDA);
  check_grad_dtypes("multi_tensor_lamb", params, grads);
  const LambTerms t = lamb_terms(h);
  const cuda::LambArgs a{float(h.beta1), t.m_weight, float(h.beta2), float(1.0 - h.beta2), float(h.eps),
                         float(h.weight_decay), t.inv_bc1, t.inv_bc2, float(h.grad_scale), h.adam_w_mode,
                         t.ratio_on, h.lr, h.ratio_min, h.ratio_max, h.max_weight_norm, dev};
  for (const Group& g : groups_of({&params, &grads, &exp_avgs, &exp_avg_sqs})) {
    c10::cuda::CUDAGuard guard(g.device);
    const cudaStream_t stream = stream_of(g.device);
    const int64_t n = int64_t(g.lists.numel.size());
    const std::vector<int64_t> offsets = cuda::chunk_offsets(g.lists);
    // Freed while the kernels may still run: the caching allocator reuses memory in stream order.
    at::Tensor offsets_dev = upload(offsets, g.device, stream);
    at::Tensor partials = at::empty({2 * std::max<int64_t>(offsets.back(), 1)}, on(g.device, at::kDouble));
    at::Tensor sums = at::empty({2 * n}, on(g.device, at::kDouble));
    at::Tensor lrs = at::empty({n}, on(g.device, at::kFloat));
    cuda::lamb(g.lists, g.first, g.second, a, partials.data_ptr<double>(), offsets_dev.data_ptr<int64_t>(),
               sums.data_ptr<double>(), lrs.data_ptr<float>(), stream);
  }
}

}  // namespace

void lamb_cuda(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
               const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
               const LambHyper& h) {
  lamb_with(params, grads, exp_avgs, exp_avg_sqs, h, cuda::DeviceScalars{});
}

void adam_cuda_scalars(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                       const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                       const AdamHyper& h, const StepScalars& d) {
  if (!d.scale_by.defined() && !d.skip.defined() && !d.step.defined())
    return adam_cuda(params, grads, exp_avgs, exp_avg_sqs, h);
  check_lists("multi_tensor_adam", {&params, &grads, &exp_avgs, &exp_avg_sqs},
              {"params", "grads", "exp_avgs", "exp_avg_sqs"}, 2, c10::DeviceType::CUDA);
  check_grad_dtypes("multi_tensor_adam", params, grads);
  check_one_device("multi_tensor_adam", params);
  const AdamTerms t = adam_terms(h);
  const cuda::AdamArgs a{float(h.beta1), float(1.0 - h.beta1), float(h.beta2), float(1.0 - h.beta2),
                         float(h.eps), float(h.grad_scale), t.step_size, t.inv_sqrt_bc2, t.decay, t.l2,
                         int(h.mode), with_step(device_scalars("multi_tensor_adam", d, h.grad_scale, params), h)};
  for (const Group& g : groups_of({&params, &grads, &exp_avgs, &exp_avg_sqs})) {
    c10::cuda::CUDAGuard guard(g.device);
    cuda::adam(g.lists, g.first, g.second, a, stream_of(g.device));
  }
}

void lamb_cuda_scalars(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                       const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                       const LambHyper& h, const StepScalars& d) {
  check_one_device("multi_tensor_lamb", params);
  lamb_with(params, grads, exp_avgs, exp_avg_sqs, h,
            with_step(device_scalars("multi_tensor_lamb", d, h.grad_scale, params), h));
}

bool scale_cuda(const std::vector<at::Tensor>& src, const std::vector<at::Tensor>& dst, double scale) {
  check_lists("multi_tensor_scale", {&src, &dst}, {"src", "dst"}, 2, c10::DeviceType::CUDA);
  bool found = false;
  for (const Group& g : groups_of({&src, &dst})) {
    c10::cuda::CUDAGuard guard(g.device);
    at::Tensor flag = at::zeros({1}, on(g.device, at::kFloat));
    cuda::scale(g.lists, g.first, g.second, scale, nullptr, flag.data_ptr<float>(), stream_of(g.device));
    found |= flag.item<float>() != 0;  // the caller asked for a host answer
  }
  return found;
}

void scale_flag_cuda(const std::vector<at::Tensor>& src, const std::vector<at::Tensor>& dst, double scale,
                     const at::Tensor& scale_by, const at::Tensor& found) {
  check_lists("multi_tensor_scale_flag", {&src, &dst}, {"src", "dst"}, 2, c10::DeviceType::CUDA);
  if (src.empty()) return;
  check_one_device("multi_tensor_scale_flag", src);
  const c10::Device device = src[0].device();
  check_scalar("multi_tensor_scale_flag", "scale_by", scale_by, at::kDouble, device);
  check_scalar("multi_tensor_scale_flag", "found", found, at::kFloat, device);
  at::Tensor flag = found.defined() ? found : at::zeros({1}, on(device, at::kFloat));
  for (const Group& g : groups_of({&src, &dst})) {
    c10::cuda::CUDAGuard guard(g.device);
    cuda::scale(g.lists, g.first, g.second, scale, scale_by.defined() ? scale_by.data_ptr<double>() : nullptr,
                flag.data_ptr<float>(), stream_of(g.device));
  }
}

namespace {

// Σx² of one group's tensors, a 0-dim float64 tensor on its device (nothing read back).
at::Tensor sum_squares_of(const Group& g) {
  c10::cuda::CUDAGuard guard(g.device);
  const cudaStream_t stream = stream_of(g.device);
  const int64_t slots = cuda::chunk_offsets(g.lists).back();
  at::Tensor offsets_dev = upload({0, slots}, g.device, stream);
  at::Tensor partials = at::empty({std::max<int64_t>(slots, 1)}, on(g.device, at::kDouble));
  at::Tensor sum = at::empty({}, on(g.device, at::kDouble));
  cuda::sum_squares(g.lists, g.first, partials.data_ptr<double>(), offsets_dev.data_ptr<int64_t>(),
                    sum.data_ptr<double>(), stream);
  return sum;
}

}  // namespace

double l2norm_cuda(const std::vector<at::Tensor>& tensors) {
  check_lists("multi_tensor_l2norm", {&tensors}, {"tensors"}, 1, c10::DeviceType::CUDA);
  double total = 0;  // the groups may be on several devices: added on the host
  for (const Group& g : groups_of({&tensors})) total += sum_squares_of(g).item<double>();
  return std::sqrt(total);
}

at::Tensor l2norm_tensor_cuda(const std::vector<at::Tensor>& tensors) {
  check_lists("multi_tensor_l2norm_tensor", {&tensors}, {"tensors"}, 1, c10::DeviceType::CUDA);
  if (tensors.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kDouble));
  check_one_device("multi_tensor_l2norm_tensor", tensors);
  at::Tensor total;  // Σx² of the groups in order, as l2norm_cuda adds them
  for (const Group& g : groups_of({&tensors})) {
    at::Tensor sum = sum_squares_of(g);
    total = total.defined() ? at::add(total, sum) : sum;
  }
  return at::sqrt(total);
}

}  // namespace torch_ort::optim
