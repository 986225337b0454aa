# Builds the torch_ort._C extension with torch.utils.cpp_extension: the torch-free core, the ATen
# runtime, the pybind11 bindings and the ONNX protobuf classes (generated code kept in csrc/proto),
# all in one .so. The private protobuf-lite comes first (scripts/build_protobuf.py, from PyPI
# sources; nothing from the system, no protoc).
#
#   pip install .                                     # a user install (scripts/build_backend.py)
#   scripts/build_wheel.sh                            # a wheel for this machine's torch
#   python setup.py build_ext --inplace               # development (scripts/bootstrap.sh does it)
#
# Why setuptools + torch.utils.cpp_extension and not scikit-build-core + CMake: the extension's
# compile and link flags (torch's include paths, its C++ ABI flag, CUDA architectures, the
# libraries to link) are what torch itself says they are, through cpp_extension; with CMake we
# would re-derive them from TorchConfig.cmake, a second source of truth. The torch-free core's
# GoogleTest build keeps its CMakeLists.txt, which needs no torch.
import glob
import importlib.util
import os
import re
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
GENERATED = os.path.join("build", "generated")  # the ONNX arity table
PROTO = os.path.join("csrc", "proto")  # the ONNX message classes
PROTOBUF = os.path.join("build", "third_party", "protobuf-lite")
PROTOBUF_LIB = os.path.join(PROTOBUF, "lib", "libprotobuf-lite.a")
# The export stack; torch is added by build() (the release built against) or sdist().
DEPENDENCIES = ["onnx>=1.23.2", "onnxscript>=0.7.2", "onnx-ir>=1.1.0", "numpy>=2.0"]

# cpp_extension reads MAX_JOBS for ninja: every core this process may use, unless set.
# ccache needs no setting: cpp_extension prepends it to the compiler when it is on PATH.
os.environ.setdefault("MAX_JOBS", str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                      else os.cpu_count() or 1))
# ccache hits across checkouts and pip's temporary build folders: paths under the tree are hashed
# relative to it (ccache reads this; the protobuf build's compiles too).
os.environ.setdefault("CCACHE_BASEDIR", ROOT)


def our_version() -> str:
    """torch_ort/_version.py's __version__, the one source of the version number."""
    with open(os.path.join(ROOT, "torch_ort", "_version.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.MULTILINE).group(1)


def rel_glob(pattern):
    # Relative paths keep object files apart by folder (csrc/core/ir/dtype.o vs
    # csrc/runtime/dtype.o) and keep the ninja file independent of where the checkout lives.
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


def unity(files, name):
    """`files` compiled as a few translation units that each #include several of them (a unity
    build, scripts/build_protobuf.py's unity_groups). Every runtime source parses ATen's headers
    first, about 6 s of a 2-core machine's time each, and every core source the STL and the IR's
    headers; grouped, the headers are parsed once per group. Two groups per compile job keep every
    core busy; ninja's dependency files name the included sources, so an edited source rebuilds
    its group. TORCH_ORT_UNITY=0 compiles the sources one by one."""
    groups = script("build_protobuf").unity_groups(ROOT, files, 2 * int(os.environ["MAX_JOBS"]),
                                                   os.path.join(ROOT, "build", "unity"), name)
    return [os.path.relpath(p, ROOT) for p in groups]


# Core sources that define a file-local name another core source defines too: compiled on their
# own in a unity build (tests/python/test_packaging.py compiles the rest as one unit to keep this
# list complete).
CORE_SOLO = frozenset(f"csrc/core/{f}" for f in (
    "ir/op_arity.cc", "ops/nn.cc", "passes/bias_dropout_fusion.cc", "passes/bias_gelu_fusion.cc",
    "passes/linear_cross_entropy_fusion.cc", "passes/skip_layer_norm_fusion.cc",
    "passes/softmax_cross_entropy_fusion.cc", "planner/placement.cc"))


def sources():
    core = rel_glob("csrc/core/**/*.cc")
    runtime = [p for p in rel_glob("csrc/runtime/**/*.cc") if "/cuda/" not in p]
    if os.environ.get("TORCH_ORT_UNITY", "1") != "0":
        runtime = unity(runtime, "runtime")
        core = unity([p for p in core if p not in CORE_SOLO], "core") + sorted(CORE_SOLO)
    bindings = [p for p in rel_glob("csrc/bindings/*.cc") if not p.endswith("cuda_module.cc")]
    return core + runtime + bindings + [os.path.join(PROTO, "torch_ort_onnx.pb.cc")]


def script(name):
    """A module of scripts/, loaded by path (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        f"torch_ort_{name}", os.path.join(ROOT, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def extensions(cpp_extension):
    ext = cpp_extension.CppExtension(
        name="torch_ort._C",
        sources=sources(),
        include_dirs=[ROOT, os.path.join(ROOT, GENERATED), os.path.join(ROOT, PROTO),
                      os.path.join(ROOT, PROTOBUF, "include")],
        extra_compile_args={"cxx": [
            "-std=c++20", "-O2", "-g0",  # -g0: Python's CFLAGS add -g (a 30 MB .so, slower builds)
            # Hidden by default: our protobuf copy and helpers must not interpose with libtorch's
            # own protobuf symbols; PYBIND11_MODULE exports PyInit__C explicitly.
            "-fvisibility=hidden", "-fvisibility-inlines-hidden",
            # at::parallel_for is a header template over OpenMP (torch's AT_PARALLEL_OPENMP):
            # without -fopenmp its pragma is dropped and the optimizer kernels run on one thread.
            "-fopenmp",
        ]},
        depends=[os.path.join(ROOT, PROTOBUF_LIB)],  # a rebuilt library relinks the extension
        extra_link_args=[
            "-fopenmp",  # libgomp.so.1: the one torch already loaded (same soname), not a second runtime
            os.path.join(ROOT, PROTOBUF_LIB),
            # Keep every symbol of the static protobuf (and abseil) out of our dynamic symbol table.
            "-Wl,--exclude-libs,ALL",
        ],
    )
    cuda = cuda_extension(cpp_extension)
    return [ext] + ([cuda] if cuda else [])


def cuda_extension(cpp_extension):
    """torch_ort._C_cuda, the CUDA optimizer kernels, when nvcc is there (TORCH_ORT_CUDA=0: skip).
    It is a separate module so that the main one never depends on the CUDA toolkit: without it,
    CUDA parameters get a clear "no CUDA kernels in this build" error from torch_ort.optim."""
    if os.environ.get("TORCH_ORT_CUDA", "1") == "0":
        return None
    home = cpp_extension.CUDA_HOME
    if home is None or not os.path.exists(os.path.join(home, "bin", "nvcc")):
        print("torch_ort: no CUDA toolkit (nvcc) found; building without torch_ort._C_cuda")
        return None
    # Without a GPU to ask, compile for the data-center generations we target: Ampere and Hopper
    # (+PTX for newer ones). Each architecture adds a few seconds on 2 cores.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
    return cpp_extension.CUDAExtension(
        name="torch_ort._C_cuda",
        # Every .cu/.cc under kernels/cuda: the optimizer kernels and the fused graph kernels.
        sources=(rel_glob("csrc/runtime/kernels/cuda/*.cu") + rel_glob("csrc/runtime/kernels/cuda/*.cc") +
                 ["csrc/bindings/cuda_module.cc"]),
        include_dirs=[ROOT],
        extra_compile_args={"cxx": ["-std=c++20", "-O2", "-g0", "-fvisibility=hidden",
                                    "-fvisibility-inlines-hidden"],
                            "nvcc": ["-O3", "-std=c++17"]},
    )


def metadata_only() -> bool:
    """pip's metadata hooks: setuptools runs egg_info for the build requirements and dist_info for
    the metadata, each in a process of its own. They need torch's version, not torch."""
    args = set(sys.argv[1:])
    return bool(args & {"egg_info", "dist_info"}) and not args & {
        "bdist_wheel", "build_ext", "build", "install", "develop", "editable_wheel"}


def check_torch(version: str) -> tuple[str, str]:
    """The torch release's (major, minor); an unsupported one is refused before anything compiles.
    The extension follows torch's C++ ABI, which changes between minor releases: the wheel
    requires the minor release it compiled against. The version stays plain (PyPI refuses local
    versions such as "+torch2.15"): a release's wheels are built against one torch, and the sdist
    builds against any supported one."""
    # torch_ort/_extension.py, loaded on its own (it imports torch only when checking a running one).
    spec = importlib.util.spec_from_file_location("torch_ort_extension", os.path.join(ROOT, "torch_ort", "_extension.py"))
    extension = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extension)
    if not extension.supported(version):
        lo, hi = (".".join(map(str, v)) for v in extension.SUPPORTED)
        raise SystemExit(f"torch_ort: torch {version} is installed; torch_ort supports torch {lo} "
                         f"to {hi}. Install a supported torch first (pip install 'torch>={lo},<="
                         f"{hi}.*').")
    major, minor = version.split(".")[:2]
    return major, minor


def metadata():
    """build()'s metadata without importing torch: seconds saved twice per `pip install`."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        major, minor = check_torch(version("torch"))
    except PackageNotFoundError:  # an isolated build asking what to install: torch comes next
        return sdist()
    setup(version=our_version(), install_requires=[f"torch=={major}.{minor}.*"] + DEPENDENCIES)


def build():
    import torch
    from torch.utils import cpp_extension

    class Build(cpp_extension.BuildExtension):
        """BuildExtension that first makes the private protobuf-lite and the ONNX arity table
        (quick when they are there already)."""

        def run(self):
            # The torch this build compiles against, read before loading the extension
            # (torch_ort/_extension.py); into the tree (--inplace) and the build folder (wheels).
            info = ('"""Written by setup.py: the torch torch_ort._C was compiled against, and the CUDA\n'
                    'architectures of torch_ort._C_cuda (empty: not built)."""\n'
                    f'TORCH_VERSION = "{torch.__version__}"\n'
                    f'CUDA_ARCHS = "{os.environ.get("TORCH_CUDA_ARCH_LIST", "") if cuda else ""}"\n')
            for base in {ROOT, os.path.abspath(self.build_lib)}:
                if os.path.isdir(os.path.join(base, "torch_ort")):
                    with open(os.path.join(base, "torch_ort", "_build_info.py"), "w") as f:
                        f.write(info)
            protobuf = script("build_protobuf")
            try:
                protobuf.ensure()
            except protobuf.BuildError as e:
                raise SystemExit(f"torch_ort: building protobuf failed: {e}") from e
            super().run()

    major, minor = check_torch(torch.__version__)
    modules = extensions(cpp_extension)
    cuda = any(m.name == "torch_ort._C_cuda" for m in modules)
    setup(
        version=our_version(),
        install_requires=[f"torch=={major}.{minor}.*"] + DEPENDENCIES,
        ext_modules=modules,
        cmdclass={"build_ext": Build.with_options(use_ninja=True)},
    )


def sdist():
    """Sources only (MANIFEST.in names them): no torch needed, the plain version, the torch range."""
    setup(version=our_version(), install_requires=[script("build_backend").TORCH] + DEPENDENCIES)


if os.environ.get("TORCH_ORT_SDIST") == "1":  # set by scripts/build_backend.py's build_sdist
    sdist()
elif metadata_only():
    metadata()
else:
    build()
