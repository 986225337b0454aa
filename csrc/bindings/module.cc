// torch_ort._C: the Python face of the engine. The only place that includes torch's Python
// headers and pybind11; it converts arguments, releases the GIL while kernels run,
// and maps each C++ error type to a Python exception class.
// torch/csrc/utils/pybind.h brings pybind11 and the at::Tensor caster without torch/all.h
// (the whole C++ frontend), which would triple this file's compile time.
#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/onnx_io.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"
#include "csrc/core/shapes/shape_rules.h"
#include "csrc/runtime/buffer_pool.h"
#include "csrc/runtime/engine.h"
#include "csrc/runtime/errors.h"
#include "csrc/runtime/kernel.h"
#include "csrc/runtime/kernels/cuda_table.h"
#include "csrc/runtime/kernels/library_ops.h"
#include "csrc/runtime/python_op.h"
#include "csrc/bindings/multi_tensor_bindings.h"

namespace py = pybind11;
using namespace torch_ort;

namespace {

py::dict stats_dict(const EngineStats& s) {
  py::dict d;
  d["num_forward_nodes"] = s.num_forward_nodes;
  d["num_backward_nodes"] = s.num_backward_nodes;
  d["num_forward_values"] = s.num_forward_values;
  d["num_saved_activations"] = s.num_saved_activations;
  d["num_saved"] = s.num_saved;
  d["num_constants"] = s.num_constants;
  d["saved_names"] = s.saved_names;
  d["passes_changed"] = s.passes_changed;
  d["kernel_workspace_bytes"] = s.kernel_workspace_bytes;
  d["recompute_nodes"] = s.recompute_nodes;
  d["host_nodes"] = s.host_nodes;
  d["to_host_forward"] = s.to_host_forward;
  d["to_host_backward"] = s.to_host_backward;
  d["to_device_forward"] = s.to_device_forward;
  d["to_device_backward"] = s.to_device_backward;
  d["host_cacheable_forward"] = s.host_cacheable_forward;
  d["host_cacheable_backward"] = s.host_cacheable_backward;
  d["op_counts"] = s.op_counts;
  return d;
}

py::dict measured_dict(const MeasuredMemory& m) {
  py::dict d;
  d["forward_peak"] = m.forward_peak;
  d["saved"] = m.saved;
  d["outputs"] = m.outputs;
  d["backward_peak"] = m.backward_peak;
  d["peak"] = m.peak;
  return d;
}

// The memory report as plain data; torch_ort.ortmodule.engine.memory_report builds the user-facing object.
py::dict report_dict(const Graph& g, const MemoryReport& r) {
  py::dict predicted;
  const PeakEstimate& p = r.predicted;
  predicted["forward_peak"] = p.forward_peak;
  predicted["saved"] = p.saved;
  predicted["outputs"] = p.outputs;
  predicted["backward_peak"] = p.backward_peak;
  predicted["peak"] = p.peak;
  predicted["constants"] = p.constants;
  predicted["forward_formula"] = p.forward_formula;
  predicted["saved_formula"] = p.saved_formula;
  predicted["backward_formula"] = p.backward_formula;
  predicted["complete"] = p.complete;
  py::list rows;
  for (size_t i = 0; i < r.recompute.opportunities.size(); ++i) {
    const RecomputeOpportunity& o = r.recompute.opportunities[i];
    py::list activations, layers;
    for (const RecomputeOccurrence& occ : o.occurrences) {
      activations.append(g.value(occ.activation).name);
      layers.append(occ.layer);
    }
    py::dict row;
    row["cluster"] = o.cluster;
    row["strategy"] = o.strategy;
    row["occurrences"] = o.occurrences.size();
    row["enabled"] = o.enabled_count();
    row["bytes_saved_each"] = r.bytes_saved_each[i];
    row["bytes_saved_formula"] = r.bytes_saved_formula[i];
    row["activations"] = activations;
    row["layers"] = layers;
    rows.append(row);
  }
  py::dict d;
  d["predicted"] = predicted;
  d["rows"] = rows;
  d["num_layers"] = r.recompute.num_layers;
  d["nodes_cloned"] = r.recompute.nodes_cloned;
  d["unknown_values"] = r.unknown_values;
  return d;
}

// The Python exception for a NodesError: `type(what)` with `.unsupported`, one
// (node, domain, op_type, missing) tuple per node the error is about (the ATen fallback reads it).
void set_nodes_error(PyObject* type, const NodesError& e) {
  py::list rows;
  for (const UnsupportedNode& n : e.nodes) rows.append(py::make_tuple(n.node, n.domain, n.op_type, n.missing));
  py::object exc = py::reinterpret_borrow<py::object>(type)(e.what());
  exc.attr("unsupported") = rows;
  PyErr_SetObject(type, exc.ptr());
}

void register_errors(py::module_& m) {
  // All are RuntimeError subclasses, so `except RuntimeError` callers keep working.
  py::register_exception<OnnxImportError>(m, "OnnxImportError", PyExc_RuntimeError);
  py::handle verify_error = py::register_exception<VerifyError>(m, "VerifyError", PyExc_RuntimeError);
  // Registered after its base, so tried first: the engine's export retry catches it by type.
  py::register_exception<ShapeInferenceError>(m, "ShapeInferenceError", verify_error.ptr());
  static PyObject* gradient_error =
      py::register_exception<GradientError>(m, "GradientError", PyExc_RuntimeError).ptr();
  static PyObject* unsupported_op_error =
      py::register_exception<UnsupportedOpError>(m, "UnsupportedOpError", PyExc_RuntimeError).ptr();
  for (PyObject* type : {gradient_error, unsupported_op_error}) {
    py::handle cls(type);
    cls.attr("unsupported") = py::list();  // (an instance raised from Python without any)
    cls.attr("__doc__") = "An op the engine cannot take. .unsupported: list of (node, domain, op_type, "
                          "missing) naming the nodes it is about, missing one of 'kernel', 'gradient "
                          "rule' (none registered), 'working gradient rule' (the rule refused the node); "
                          "domain '' is the ONNX domain. Empty when the error is not about particular ops.";
  }
  py::handle kernel_error = py::register_exception<KernelError>(m, "KernelError", PyExc_RuntimeError);
  py::register_exception<DecisionChangedError>(m, "DecisionChangedError", kernel_error.ptr());
  py::register_exception<RunContextError>(m, "RunContextError", PyExc_RuntimeError);
  // Registered after register_exception's own translators, so tried before them.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const GradientError& e) {
      set_nodes_error(gradient_error, e);
    } catch (const UnsupportedOpError& e) {
      set_nodes_error(unsupported_op_error, e);
    } catch (const InputMismatchError& e) {
      // Wrong inputs are the caller's type error (count, dtype, rank), as in torch itself.
      PyErr_SetString(PyExc_TypeError, e.what());
    }
  });
}

// The PythonOp kernel's way back into Python (csrc/runtime/python_op.h). Kernels run without the
// GIL; the callback takes it for the call. A Python exception becomes a C++ one carrying its text
// (the executor names the node); torch_ort.ortmodule.export.python_op keeps the original to re-raise.
void install_python_op_runner(py::object fn) {
  auto holder = std::shared_ptr<py::object>(new py::object(std::move(fn)), [](py::object* p) {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      delete p;
    }
  });
  set_python_op_runner([holder](int64_t id, const std::vector<at::Tensor>& args, bool record) {
    py::gil_scoped_acquire gil;
    try {
      py::list py_args;
      for (const at::Tensor& t : args) py_args.append(t.defined() ? py::cast(t) : py::none());
      return (*holder)(id, py_args, record).cast<std::vector<at::Tensor>>();
    } catch (py::error_already_set& e) {
      throw std::runtime_error(e.what());
    }
  });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_ort C++ engine: ONNX graph -> passes -> autodiff -> plan -> ATen kernels";
  register_errors(m);

  py::class_<RunContext, std::shared_ptr<RunContext>>(m, "RunContext",
      "What one training forward keeps for its backward (the saved set); consumed by backward.")
      .def_property_readonly("consumed", [](const RunContext& c) { return c.consumed.load(); })
      .def_property_readonly("num_saved", [](const RunContext& c) { return c.saved.size(); })
      .def_property_readonly("host_reads", [](const RunContext& c) { return c.host_reads; },
                             "device→host reads the forward call made");

  // `with _C.CudaGraphCapture():` around a CUDA graph capture of engine calls on this thread:
  // device buffers steps keep across runs (ToDevice's uploads) that the capture reads are kept
  // for the engine's lifetime (kernel.h, CaptureScope).
  struct PyCaptureScope {
    std::unique_ptr<CaptureScope> scope;
  };
  py::class_<PyCaptureScope>(m, "CudaGraphCapture",
      "Context manager: engine calls inside it are being captured into a CUDA graph.")
      .def(py::init<>())
      .def("__enter__", [](PyCaptureScope& s) { s.scope = std::make_unique<CaptureScope>(); })
      .def("__exit__", [](PyCaptureScope& s, py::args) { s.scope.reset(); return false; });

  py::class_<BackwardRun>(m, "BackwardRun",
      "A backward in progress (Engine.backward_begin), continued by Engine.backward_take.")
      .def_property_readonly("next_step", [](const BackwardRun& r) { return r.next; })
      .def_property_readonly("finished", [](const BackwardRun& r) { return r.finished; });

  py::class_<Engine>(m, "Engine", "One exported graph compiled for one mode (training or not).")
      .def(py::init([](py::bytes onnx, bool training, std::vector<bool> input_requires_grad,
                       std::vector<std::string> disabled_passes, int memory_opt_level,
                       std::vector<std::tuple<std::string, int, int64_t>> recompute,
                       std::vector<int64_t> dropped_outputs, int64_t loss_chunk_bytes) {
             std::string bytes = onnx;
             EngineOptions options{training, std::move(input_requires_grad),
                                   std::move(disabled_passes), memory_opt_level};
             for (auto& [cluster, strategy, count] : recompute)
               options.recompute.push_back(RecomputeRequest{cluster, strategy, count});
             options.dropped_outputs = std::move(dropped_outputs);
             options.loss_chunk_bytes = loss_chunk_bytes;
             py::gil_scoped_release nogil;
             return std::make_unique<Engine>(bytes, std::move(options));
           }),
           py::arg("onnx_bytes"), py::arg("training"), py::arg("input_requires_grad"),
           py::arg("disabled_passes") = std::vector<std::string>{},
           py::arg("memory_opt_level") = 0,
           py::arg("recompute") = std::vector<std::tuple<std::string, int, int64_t>>{},
           py::arg("dropped_outputs") = std::vector<int64_t>{}, py::arg("loss_chunk_bytes") = 0,
           "recompute: ORTMODULE_MEMORY_OPT_CONFIG entries (cluster, strategy, count); an unknown "
           "cluster raises ValueError listing the valid ones. dropped_outputs: graph outputs not "
           "computed (positions in the exported graph's outputs). loss_chunk_bytes: logits bytes per "
           "chunk of the fused LM head and loss (0: its default)")
      .def_property_readonly("training", &Engine::training)
      .def_property_readonly("input_names", &Engine::input_names)
      .def_property_readonly("output_names", &Engine::output_names)
      .def_property_readonly("output_differentiable", &Engine::output_differentiable)
      .def_property_readonly("input_grad_available", &Engine::input_grad_available)
      .def("forward",
           [](const Engine& e, const std::vector<at::Tensor>& inputs) {
             std::pair<std::vector<at::Tensor>, std::shared_ptr<RunContext>> r;
             {
               py::gil_scoped_release nogil;
               r = e.forward(inputs);
             }
             py::object ctx = r.second ? py::cast(r.second) : py::none();
             return py::make_tuple(py::cast(r.first), ctx);
           },
           py::arg("inputs"),
           "forward(inputs: list[Tensor]) -> (list[Tensor], RunContext | None)")
      .def("backward",
           [](const Engine& e, RunContext& ctx,
              const std::vector<std::optional<at::Tensor>>& grad_outputs) {
             py::gil_scoped_release nogil;
             return e.backward(ctx, grad_outputs);
           },
           py::arg("ctx"), py::arg("grad_outputs"),
           "backward(ctx, grad_outputs: list[Tensor | None]) -> list[Tensor | None]")
      .def("backward_begin",
           [](const Engine& e, RunContext& ctx,
              const std::vector<std::optional<at::Tensor>>& grad_outputs) {
             py::gil_scoped_release nogil;
             return e.backward_begin(ctx, grad_outputs);
           },
           py::arg("ctx"), py::arg("grad_outputs"),
           "backward_begin(ctx, grad_outputs) -> BackwardRun: consumes ctx, runs nothing yet")
      .def("backward_take",
           [](const Engine& e, BackwardRun& run, int64_t steps, const std::vector<int64_t>& inputs) {
             py::gil_scoped_release nogil;
             return e.backward_take(run, steps, inputs);
           },
           py::arg("run"), py::arg("steps"), py::arg("inputs"),
           "backward_take(run, steps: int, inputs: list[int]) -> list[Tensor | None]: runs backward "
           "up to `steps` steps (-1: all) and hands over these graph inputs' gradients")
      .def_property_readonly("input_grad_ready", &Engine::input_grad_ready,
           "per graph input: backward steps after which its gradient is final (-1: none)")
      .def_property_readonly("num_backward_steps", &Engine::num_backward_steps)
      .def_property_readonly("backward_runs_opaque_code", &Engine::backward_runs_opaque_code,
           "whether backward runs a PythonOp, ATenOp or ATenOpGrad (code that may raise anything)")
      .def("forward_graph_onnx",
           [](const Engine& e) { return py::bytes(e.forward_graph_onnx()); })
      .def("training_graph_onnx",
           [](const Engine& e) { return py::bytes(e.training_graph_onnx()); })
      .def("stats", [](const Engine& e) { return stats_dict(e.stats()); })
      .def_property_readonly("last_label_density", &Engine::last_label_density,
           "share of labels counted by the last forward's label sparsity (-1: none ran)")
      .def_property_readonly("last_row_density", &Engine::last_row_density,
           "share of (batch, sequence) rows the last forward's padding elimination kept (-1: none ran)")
      .def_property_readonly("last_host_reads_forward", &Engine::last_host_reads_forward,
                             "device→host reads of the last forward call (-1: none yet); counted on "
                             "every device, on the CPU as if the values lived on a device")
      .def_property_readonly("runs_opaque_code", &Engine::runs_opaque_code,
                             "forward or backward runs PythonOp/ATenOp/ATenOpGrad (code we do not control)")
      .def_property_readonly("last_host_reads_backward", &Engine::last_host_reads_backward,
                             "device→host reads of the last finished backward (-1: none yet)")
      .def_property_readonly("last_host_steps_forward", &Engine::last_host_steps_forward,
                             "host steps (shape arithmetic) the last forward ran (-1: none yet)")
      .def_property_readonly("last_host_steps_backward", &Engine::last_host_steps_backward,
                             "host steps the last finished backward ran (-1: none yet)")
      .def_property_readonly("last_host_steps_cached_forward", &Engine::last_host_steps_cached_forward,
                             "host steps the last forward took from the per-shape cache instead")
      .def_property_readonly("last_host_steps_cached_backward",
                             &Engine::last_host_steps_cached_backward,
                             "host steps the last finished backward took from the per-shape cache")
      .def_property_readonly("host_cache_size", &Engine::host_cache_size,
                             "input-shape signatures whose host values the engine holds (bounded)")
      .def("host_values",
           [](const Engine& e) {
             const Graph& g = e.memory_graph();
             std::vector<std::string> names;
             for (ValueId v = 0; v < g.num_values(); ++v)
               if (e.placement().on_host(v)) names.push_back(g.value(v).name);
             return names;
           },
           "names of the executed graph's values that live on the host (shapes, scalar controls)")
      .def("memory_report",
           [](const Engine& e, const std::vector<std::vector<int64_t>>& input_sizes) {
             return report_dict(e.memory_graph(), e.memory_report(input_sizes));
           },
           py::arg("input_sizes"),
           "memory_report(input_sizes: list[list[int]]) -> dict: the static peak estimate (bytes "
           "and formulas) and the recompute opportunities, for inputs of these sizes")
      .def("set_memory_tracking", &Engine::set_memory_tracking, py::arg("on"),
           "measure the activation bytes of every run while on (a small per-step cost)")
      .def("measured_memory", [](const Engine& e) { return measured_dict(e.measured_memory()); },
           "the last measured step: forward_peak, saved, outputs, backward_peak, peak (-1: none)")
      .def("value_shapes", &Engine::value_shapes,
           "value_shapes() -> list[(name, inferred shape)] of the executed graph, e.g. ('h', '[s0,32]')")
      .def("check_shapes",
           [](const Engine& e, const std::vector<at::Tensor>& inputs) {
             std::vector<ValueShapeCheck> rows;
             {
               py::gil_scoped_release nogil;
               rows = e.check_shapes(inputs);
             }
             py::list out;
             for (const ValueShapeCheck& r : rows) {
               py::dict d;
               d["name"] = r.name;
               d["inferred"] = r.inferred;
               d["actual"] = r.actual;
               d["rank_known"] = r.rank_known;
               d["unchecked_dims"] = r.unchecked_dims;
               out.append(d);
             }
             return out;
           },
           py::arg("inputs"),
           "Debug: runs forward (+ backward with ones) keeping every tensor and compares each with "
           "its inferred shape; raises VerifyError naming the first value that disagrees.");

  optim::bind_multi_tensor(m, {&optim::adam_cpu_scalars, &optim::lamb_cpu_scalars, &optim::scale_cpu,
                               &optim::l2norm_cpu, &optim::scale_flag_cpu, &optim::l2norm_tensor_cpu});
  m.def("optim_cpu_path", &optim::cpu_path,
        "'avx512', 'avx2' or 'portable': the widest CPU loops that run. AVX-512: the optimizer "
        "kernels, BiasGelu, FusedElementwise and LinearCrossEntropy's rows; AVX2: "
        "LinearCrossEntropy's rows (the rest takes the portable path).");
  m.def("set_optim_cpu_path", &optim::set_cpu_path, py::arg("path"),
        "'auto' (the widest the processor has), 'avx512', 'avx2' or 'portable' (tests run each); "
        "ValueError for one the processor lacks.");

  m.def("allow_library_op", &kernels::allow_library_op, py::arg("qualified"),
        "Lets ATenOp call the dispatcher operator 'namespace::name.overload' of a library other "
        "than aten (the ATen fallback routes it while exporting).");
  m.def("allowed_library_ops", &kernels::allowed_library_ops,
        "The operators of other libraries than aten that ATenOp may call in this process.");
  m.def("live_runs", [] {
        return py::make_tuple(LiveCount<RunContext>::alive.load(), LiveCount<BackwardRun>::alive.load());
      },
      "(run contexts, backward runs) alive in this process: what training forwards keep for a "
      "backward that has not finished; each dies with the outputs (autograd graph) that own it.");
  m.def("set_cpu_buffer_pool", [](bool on) { BufferPool::process().set_enabled(on); }, py::arg("on"),
        "ORTMODULE_CPU_BUFFER_POOL: keep the kernels' large CPU buffers across steps (off: give "
        "back every idle one now and allocate afresh from then on).");
  m.def("cpu_buffer_pool", [] {
        const BufferPool& p = BufferPool::process();
        return py::dict(py::arg("enabled") = p.enabled(), py::arg("idle_bytes") = p.idle_bytes(),
                        py::arg("reused") = p.reused());
      },
      "{'enabled', 'idle_bytes' (held for the next step, not in use), 'reused' (requests served "
      "from the pool since the process began)}.");
  m.def("set_python_op_runner", &install_python_op_runner, py::arg("runner"),
        "Installs run(func_id, args: list[Tensor | None], record: bool) -> list[Tensor], the "
        "callback PythonOp nodes call (torch_ort.ortmodule.export.python_op installs it).");
  m.def("verify_onnx",
        [](py::bytes onnx) {
          std::string bytes = onnx;
          verify(import_onnx(bytes));
        },
        py::arg("onnx_bytes"), "Imports ONNX bytes and runs the IR verifier (raises VerifyError).");
  m.def("kernel_ops", [] { return KernelRegistry::instance().ops(); },
        "'domain::op' of every registered kernel ('' is the ONNX domain).");
  m.def("differentiable_ops", [] {
        std::vector<std::string> out;
        const auto& reg = GradientRegistry::instance();
        for (const std::string& key : reg.ops()) {
          const size_t sep = key.find("::");
          if (reg.find(key.substr(0, sep), key.substr(sep + 2))->rule) out.push_back(key);
        }
        return out;
      },
      "'domain::op' of every op with a gradient rule (NO_GRADIENT entries left out).");
  m.def("pass_names", &pass_names,
        "Every graph pass, in pipeline order (forward passes, then those run after autodiff); "
        "any of them may be named in Engine(disabled_passes=...) / ORTMODULE_DISABLED_PASSES.");
  m.def("required_pass_names", &required_pass_names,
        "The passes that cannot be disabled (lowerings later stages depend on).");
  m.def("shape_ops", [] { return ShapeRegistry::instance().ops(); },
        "'domain::op' of every shape inference rule.");
  m.def("gradient_ops", [] { return GradientRegistry::instance().ops(); },
        "'domain::op' of every gradient registry entry (rules and NO_GRADIENT).");
  // torch_ort._C_cuda registers its fused CUDA kernels through this (kernels/cuda_table.h).
  m.def("_cuda_kernel_table", [] {
        using Register = void (*)(const char*, void*);
        return py::capsule(reinterpret_cast<void*>(static_cast<Register>(&register_cuda_kernel)),
                           "torch_ort.cuda_kernel_table");
      });
  m.def("cuda_kernels", &cuda_kernel_names,
        "Names of the fused CUDA kernels torch_ort._C_cuda registered (empty until it is imported).");
}
