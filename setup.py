# Builds the torch_ort._C extension with torch.utils.cpp_extension: the torch-free core, the ATen
# runtime, the pybind11 bindings and the generated ONNX protobuf classes, all in one .so.
#
#   scripts/build_protobuf.sh                                   # once: protobuf-lite + classes
#   MAX_JOBS=2 pip install -e . --no-build-isolation            # or: python setup.py build_ext --inplace
import glob
import os
import re

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
GENERATED = os.path.join("build", "generated")
PROTOBUF = os.path.join("build", "third_party", "protobuf-lite")
PROTOBUF_LIB = os.path.join(PROTOBUF, "lib", "libprotobuf-lite.a")

# The build machine has 2 cores shared with other work; cpp_extension reads MAX_JOBS for ninja.
# ccache needs no setting: cpp_extension prepends it to the compiler when it is on PATH.
os.environ.setdefault("MAX_JOBS", "2")


def rel_glob(pattern):
    # Relative paths keep object files apart by folder (csrc/core/ir/dtype.o vs
    # csrc/runtime/dtype.o) and keep the ninja file independent of where the checkout lives.
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


def sources():
    runtime = [p for p in rel_glob("csrc/runtime/**/*.cc") if "/cuda/" not in p]
    bindings = [p for p in rel_glob("csrc/bindings/*.cc") if not p.endswith("cuda_module.cc")]
    return (rel_glob("csrc/core/**/*.cc") + runtime + bindings +
            rel_glob(os.path.join(GENERATED, "*.pb.cc")))


class Build(BuildExtension):
    """BuildExtension that first checks for the protobuf artefacts, with a message saying how to
    make them (a bare compiler error about a missing onnx header would not)."""

    def run(self):
        needed = [os.path.join(GENERATED, "torch_ort_onnx.pb.cc"),
                  os.path.join(GENERATED, "torch_ort_onnx.pb.h"),
                  os.path.join(PROTOBUF, "include", "google", "protobuf", "message_lite.h"),
                  PROTOBUF_LIB]
        missing = [p for p in needed if not os.path.exists(os.path.join(ROOT, p))]
        if missing:
            raise SystemExit("torch_ort: missing " + ", ".join(missing) +
                             "\n  run scripts/build_protobuf.sh first (it builds a private "
                             "protobuf-lite and generates the ONNX message classes), then retry.")
        super().run()


ext = CppExtension(
    name="torch_ort._C",
    sources=sources(),
    include_dirs=[ROOT, os.path.join(ROOT, GENERATED), os.path.join(ROOT, PROTOBUF, "include")],
    extra_compile_args={"cxx": [
        "-std=c++20", "-O2", "-g0",  # -g0: Python's CFLAGS add -g (a 30 MB .so, slower builds)
        # Hidden by default: our protobuf copy and helpers must not interpose with libtorch's
        # own protobuf symbols; PYBIND11_MODULE exports PyInit__C explicitly.
        "-fvisibility=hidden", "-fvisibility-inlines-hidden",
        # at::parallel_for is a header template over OpenMP (torch's AT_PARALLEL_OPENMP): without
        # -fopenmp its pragma is dropped and the optimizer kernels run on one thread.
        "-fopenmp",
    ]},
    extra_link_args=[
        "-fopenmp",  # libgomp.so.1: the one torch already loaded (same soname), not a second runtime
        os.path.join(ROOT, PROTOBUF_LIB),
        # Keep every symbol of the static protobuf out of our dynamic symbol table.
        "-Wl,--exclude-libs,ALL",
    ],
)



def cuda_extension():
    """torch_ort._C_cuda, the CUDA optimizer kernels, when nvcc is there (TORCH_ORT_CUDA=0: skip).
    It is a separate module so that the main one never depends on the CUDA toolkit: without it,
    CUDA parameters get a clear "no CUDA kernels in this build" error from torch_ort.optim."""
    if os.environ.get("TORCH_ORT_CUDA", "1") == "0":
        return None
    if CUDA_HOME is None or not os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc")):
        print("torch_ort: no CUDA toolkit (nvcc) found; building without torch_ort._C_cuda")
        return None
    # Without a GPU to ask, compile for the data-center generations we target: Ampere and Hopper
    # (+PTX for newer ones). Each architecture adds a few seconds on 2 cores.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
    return CUDAExtension(
        name="torch_ort._C_cuda",
        # Every .cu/.cc under kernels/cuda: the optimizer kernels and the fused graph kernels.
        sources=(rel_glob("csrc/runtime/kernels/cuda/*.cu") + rel_glob("csrc/runtime/kernels/cuda/*.cc") +
                 ["csrc/bindings/cuda_module.cc"]),
        include_dirs=[ROOT],
        extra_compile_args={"cxx": ["-std=c++20", "-O2", "-g0", "-fvisibility=hidden",
                                    "-fvisibility-inlines-hidden"],
                            "nvcc": ["-O3", "-std=c++17"]},
    )


def version() -> str:
    """torch_ort/__init__.py's __version__ (the one source), with the torch this build compiles
    against as the local version ("0.1.0+torch2.15"): the extension follows torch's C++ ABI, so a
    wheel is for that torch only."""
    with open(os.path.join(ROOT, "torch_ort", "__init__.py")) as f:
        ours = re.search(r'^__version__ = "([^"]+)"', f.read(), re.MULTILINE).group(1)
    major, minor = torch.__version__.split(".")[:2]
    return f"{ours}+torch{major}.{minor}"


cuda_ext = cuda_extension()
setup(
    version=version(),
    ext_modules=[ext] + ([cuda_ext] if cuda_ext else []),
    cmdclass={"build_ext": Build.with_options(use_ninja=True)},
)
