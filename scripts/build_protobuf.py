#!/usr/bin/env python3
"""Builds the private protobuf-lite runtime and generates our ONNX message classes.

Everything comes from PyPI, so no root, apt or system protobuf is needed:
  * the C++ sources of protobuf and abseil from the grpcio-tools source distribution (PyPI's
    protobuf sdist holds only upb), downloaded once and checked against a pinned SHA-256;
  * protoc compiled here from those same sources (C++ generator only), so the generated classes
    and the runtime they compile against are one protobuf release.

Why a private copy at all:
  * libtorch_cpu.so exports google::protobuf symbols of ANOTHER protobuf version; a shared system
    libprotobuf would interpose with them. We link protobuf statically and hide it
    (-fvisibility=hidden here, -Wl,--exclude-libs,ALL at every final .so link).
  * The objects go into a Python extension, so they are compiled position-independent (-fPIC),
    which distribution static libraries usually are not.
  * Two libraries in one process that register "onnx/onnx.proto" abort with "File already exists
    in database". We generate from the onnx package's own onnx.proto under a private package
    (torch_ort_onnx) and file name; the wire format does not depend on either.

Outputs (under build/, ignored by git):
  build/third_party/protobuf-lite/{include,lib/libprotobuf-lite.a}   protobuf-lite + abseil
  build/generated/torch_ort_onnx.{proto,pb.h,pb.cc}                  C++ namespace torch_ort_onnx
Idempotent: a finished library is recognised by a stamp naming the source release and flags, and
the classes are regenerated only when the rewritten proto changes (ninja stays quiet).

setup.py calls ``ensure()``; run it by hand for the CMake (GoogleTest) build. Environment:
  TORCH_ORT_GRPC_TOOLS_SDIST   a local grpcio_tools-<version>.tar.gz (offline builds)
  PIP_INDEX_URL                a PyPI-compatible simple index (default https://pypi.org/simple)
  ONNX_PROTO                   onnx.proto to generate from (default: the importable onnx's)
  CXX, CC, MAX_JOBS            compilers (default c++, cc) and parallel jobs (default 2)
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request

# The protobuf release (C++ 7.35.1 = protobuf 35.1) and abseil that grpcio-tools 1.85.1 carries.
GRPC_TOOLS_VERSION = "1.85.1"
GRPC_TOOLS_SDIST = f"grpcio_tools-{GRPC_TOOLS_VERSION}.tar.gz"
GRPC_TOOLS_SHA256 = "d6f1ee213a07de9462c90ee5debe4a78dff20306a0fb394a65d48b2f94fe31a1"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THIRD_PARTY = os.path.join(ROOT, "build", "third_party")
PREFIX = os.path.join(THIRD_PARTY, "protobuf-lite")
LIBRARY = os.path.join(PREFIX, "lib", "libprotobuf-lite.a")
PROTOC = os.path.join(PREFIX, "bin", "protoc_cpp")
GENERATED = os.path.join(ROOT, "build", "generated")

# abseil's options that default to "whatever this compiler offers" (2), pinned to abseil's own
# types (0): a choice made per compiler would differ between the gcc that builds this library and
# a clang that compiles against its headers (the sanitizer build), and the two would disagree on
# the types' layout.
ABSEIL_OPTIONS = {"ABSL_OPTION_USE_STD_SOURCE_LOCATION": "0", "ABSL_OPTION_USE_STD_ORDERING": "0"}
# abseil takes std::source_location to exist in any C++20 compile that has the header; clang 14
# with libstdc++ 12 has the header but not the type (it needs a builtin clang 14 lacks). Only the
# library's own feature macro is trusted.
SOURCE_LOCATION_CHECK = (
    "#elif (defined(__cpp_lib_source_location) &&    \\\n"
    "       __cpp_lib_source_location >= 201907L) || \\\n"
    "    (defined(ABSL_INTERNAL_CPLUSPLUS_LANG) &&   \\\n"
    "     ABSL_INTERNAL_CPLUSPLUS_LANG >= 202002L)\n",
    "#elif defined(__cpp_lib_source_location) && __cpp_lib_source_location >= 201907L\n")

# Same standard as our own sources.
FLAGS = ["-std=c++20", "-O2", "-g0", "-DNDEBUG", "-fPIC", "-fvisibility=hidden",
         "-fvisibility-inlines-hidden", "-w"]
C_FLAGS = ["-O2", "-g0", "-DNDEBUG", "-fPIC", "-fvisibility=hidden", "-w"]


def log(message: str) -> None:
    print(f"[build_protobuf] {message}", flush=True)


class BuildError(RuntimeError):
    pass


# --- sources -----------------------------------------------------------------------------------

def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_ort")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(path: str) -> None:
    """The sdist from a PEP 503 simple index (pip's PIP_INDEX_URL, else PyPI)."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    page_url = f"{index}/grpcio-tools/"
    log(f"downloading {GRPC_TOOLS_SDIST} (protobuf and abseil C++ sources) from {index}")
    try:
        with urllib.request.urlopen(page_url, timeout=120) as response:
            page = response.read().decode("utf-8", "replace")
        links = [urllib.parse.urljoin(page_url, href)
                 for href in re.findall(r'href="([^"]+)"', page) if GRPC_TOOLS_SDIST in href]
        if not links:
            raise BuildError(f"{page_url} lists no {GRPC_TOOLS_SDIST}")
        tmp = path + ".part"
        with urllib.request.urlopen(links[0].split("#")[0], timeout=600) as response, \
                open(tmp, "wb") as f:
            shutil.copyfileobj(response, f)
        os.replace(tmp, path)
    except OSError as e:
        raise BuildError(f"cannot download {GRPC_TOOLS_SDIST} from {index} ({e}); download it "
                         f"yourself and set TORCH_ORT_GRPC_TOOLS_SDIST to its path") from e


def sdist() -> str:
    """The verified grpcio-tools source archive: the one named by the environment, else the
    cached download, else a fresh download."""
    given = os.environ.get("TORCH_ORT_GRPC_TOOLS_SDIST")
    if given:
        path = os.path.abspath(given)
    else:
        os.makedirs(_cache_dir(), exist_ok=True)
        path = os.path.join(_cache_dir(), GRPC_TOOLS_SDIST)
        if not os.path.exists(path) or _sha256(path) != GRPC_TOOLS_SHA256:
            _download(path)
    if not os.path.exists(path):
        raise BuildError(f"{path} does not exist")
    got = _sha256(path)
    if got != GRPC_TOOLS_SHA256:
        raise BuildError(f"{path} has SHA-256 {got}, expected {GRPC_TOOLS_SHA256} "
                         f"({GRPC_TOOLS_SDIST})")
    return path


def unpack(archive: str) -> str:
    """The protobuf and abseil trees (and grpcio-tools' list of the files protoc needs) under
    build/third_party/src; returns the unpacked root."""
    top = f"grpcio_tools-{GRPC_TOOLS_VERSION}"
    dest = os.path.join(THIRD_PARTY, "src")
    root = os.path.join(dest, top)
    stamp = os.path.join(root, ".unpacked")
    if os.path.exists(stamp):
        return root
    shutil.rmtree(root, ignore_errors=True)
    wanted = (f"{top}/protoc_lib_deps.py", f"{top}/third_party/abseil-cpp/",
              f"{top}/third_party/protobuf/src/", f"{top}/third_party/protobuf/third_party/utf8_range/",
              f"{top}/third_party/protobuf/LICENSE")
    with tarfile.open(archive) as tar:
        # Plain files and folders under the wanted paths only (no links, no ".." anywhere): what
        # tarfile's "data" filter enforces, which Python < 3.11.4 lacks.
        members = [m for m in tar.getmembers()
                   if (m.isfile() or m.isdir()) and m.name.startswith(wanted)
                   and ".." not in m.name.split("/")]
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:
            tar.extractall(dest, members=members)
    open(stamp, "w").close()
    return root


def _cmake_list(root: str, name: str) -> list[str]:
    """A source list of protobuf's own CMake file lists, relative to root."""
    with open(os.path.join(root, "third_party", "protobuf", "src", "file_lists.cmake")) as f:
        block = re.search(rf"^set\({name}\n(.*?)\n\)", f.read(), re.DOTALL | re.MULTILINE)
    if block is None:
        raise BuildError(f"file_lists.cmake has no {name} list")
    return [line.strip().replace("${protobuf_SOURCE_DIR}", "third_party/protobuf")
            for line in block.group(1).splitlines() if line.strip()]


def _posix(paths: list[str]) -> list[str]:
    return [p for p in paths if not re.search(r"_win(32)?\.cc$", p)]


def source_lists(root: str) -> dict[str, list[str]]:
    """The sources of each part, relative to root: "lite" (protobuf-lite), "full" (the rest of
    libprotobuf, for protoc), "compiler" (protoc's core and C++ generator), "abseil", "c".

    protobuf's CMake file lists name the protobuf parts; grpcio-tools' list of protoc's
    dependencies names every abseil file protobuf needs (the archive holds them all and the
    linker keeps only what is referenced)."""
    lite = _posix(_cmake_list(root, "libprotobuf_lite_srcs"))
    full = [p for p in _posix(_cmake_list(root, "libprotobuf_srcs")) if p not in lite]
    # Only the C++ generator: the other languages' generators and upb's are never registered.
    compiler = [p for p in _cmake_list(root, "libprotoc_srcs")
                if "/upb_generator/" not in p and not re.search(
                    r"/compiler/(csharp|java|kotlin|objectivec|php|python|ruby|rust)/", p)]
    with open(os.path.join(root, "protoc_lib_deps.py")) as f:
        abseil = _posix(re.findall(r"'(third_party/abseil-cpp/[^']+\.cc)'", f.read()))
    if not abseil:
        raise BuildError("protoc_lib_deps.py lists no abseil sources")
    return {"lite": lite, "full": full, "compiler": compiler, "abseil": abseil,
            "c": ["third_party/protobuf/third_party/utf8_range/utf8_range.c"]}


# --- the library -------------------------------------------------------------------------------

def _ninja() -> str:
    found = shutil.which("ninja")
    if found:
        return found
    try:
        import ninja  # the PyPI package, a build requirement of ours
        return os.path.join(ninja.BIN_DIR, "ninja")
    except ImportError as e:
        raise BuildError("ninja not found: pip install ninja") from e


def _launcher() -> str:
    return "ccache " if shutil.which("ccache") and os.environ.get("CCACHE_DISABLE") != "1" else ""


def build_library(jobs: int) -> None:
    """libprotobuf-lite.a (lite runtime, abseil, utf8_range) and protoc_cpp, from one ninja file."""
    cxx = os.environ.get("CXX", "c++")
    cc = os.environ.get("CC", "cc")
    # The stamp names what decides the library's contents (release, flags, patches), not the
    # compiler's command name: a tree carried to a machine whose CXX is spelled differently (g++
    # for c++) reuses its library instead of rebuilding it from a download it may not reach.
    flags = " ".join(FLAGS + C_FLAGS + sorted(f"{k}={v}" for k, v in ABSEIL_OPTIONS.items())
                     + list(SOURCE_LOCATION_CHECK))
    stamp = os.path.join(PREFIX, f"built-{GRPC_TOOLS_VERSION}-" +
                         hashlib.sha256(flags.encode()).hexdigest()[:12])
    if os.path.exists(stamp) and os.path.exists(LIBRARY) and os.path.exists(PROTOC):
        return
    root = unpack(sdist())
    pin_abseil_options(root)
    parts = source_lists(root)
    includes = " ".join(f"-I{os.path.join(root, d)}" for d in
                        ("third_party/abseil-cpp", "third_party/protobuf/src",
                         "third_party/protobuf/third_party/utf8_range"))
    work = os.path.join(THIRD_PARTY, "build", "protobuf-lite")
    os.makedirs(work, exist_ok=True)
    launcher = _launcher()
    lines = [
        f"cxxflags = {' '.join(FLAGS)} {includes}",
        f"cflags = {' '.join(C_FLAGS)} {includes}",
        f"rule cxx\n  command = {launcher}{cxx} $cxxflags -MMD -MF $out.d -c $in -o $out\n"
        f"  depfile = $out.d\n  deps = gcc\n  description = CXX $in",
        f"rule cc\n  command = {launcher}{cc} $cflags -MMD -MF $out.d -c $in -o $out\n"
        f"  depfile = $out.d\n  deps = gcc\n  description = CC $in",
        "rule ar\n  command = rm -f $out && ar qc $out $in && ranlib $out\n  description = AR $out",
        f"rule link\n  command = {cxx} $in -o $out -lpthread\n  description = LINK $out",
    ]

    def compile_all(sources: list[str], rule: str, base: str) -> list[str]:
        objects = []
        for source in sources:
            obj = os.path.join(work, "obj", re.sub(r"\.(cc|c)$", ".o", source))
            objects.append(obj)
            lines.append(f"build {obj}: {rule} {os.path.join(base, source)}")
        return objects

    runtime = (compile_all(parts["lite"] + parts["abseil"], "cxx", root) +
               compile_all(parts["c"], "cc", root))
    tool = compile_all(parts["full"] + parts["compiler"], "cxx", root)
    main = compile_all(["scripts/protoc_cpp.cc"], "cxx", ROOT)
    lines.append(f"build {LIBRARY}: ar {' '.join(runtime)}")
    lines.append(f"build {PROTOC}: link {' '.join(main + tool + runtime)}")
    with open(os.path.join(work, "build.ninja"), "w") as f:
        f.write("\n".join(lines) + "\n")
    log(f"compiling protobuf-lite, abseil and a C++-only protoc ({len(runtime) + len(tool) + 1} "
        f"files, {jobs} jobs; PIC, hidden visibility) into {PREFIX}")
    os.makedirs(os.path.dirname(LIBRARY), exist_ok=True)
    os.makedirs(os.path.dirname(PROTOC), exist_ok=True)
    # ccache hits across checkouts: paths under the tree are hashed relative to it.
    env = dict(os.environ, CCACHE_BASEDIR=os.environ.get("CCACHE_BASEDIR", ROOT))
    result = subprocess.run([_ninja(), "-C", work, "-j", str(jobs)], env=env)
    if result.returncode != 0:
        raise BuildError(f"compiling protobuf failed (ninja exit {result.returncode})")
    install_headers(root)
    for old in os.listdir(PREFIX):
        if old.startswith((".built-", "built-")):
            os.remove(os.path.join(PREFIX, old))
    open(stamp, "w").close()


def pin_abseil_options(root: str) -> None:
    path = os.path.join(root, "third_party", "abseil-cpp", "absl", "base", "options.h")
    with open(path) as f:
        text = f.read()
    for option, value in ABSEIL_OPTIONS.items():
        text, n = re.subn(rf"^#define {option} \d+$", f"#define {option} {value}", text,
                          flags=re.MULTILINE)
        if n != 1:
            raise BuildError(f"{path} has no '#define {option}' line")
    with open(path, "w") as f:
        f.write(text)
    path = os.path.join(root, "third_party", "abseil-cpp", "absl", "base", "config.h")
    with open(path) as f:
        text = f.read()
    old, new = SOURCE_LOCATION_CHECK
    if old in text:
        text = text.replace(old, new)
        with open(path, "w") as f:
            f.write(text)
    elif new not in text:
        raise BuildError(f"{path}: the std::source_location check is not the expected one")


def install_headers(root: str) -> None:
    include = os.path.join(PREFIX, "include")
    shutil.rmtree(include, ignore_errors=True)
    trees = (("third_party/protobuf/src", "google"), ("third_party/abseil-cpp", "absl"))
    for base, top in trees:
        for folder, _, files in os.walk(os.path.join(root, base, top)):
            for name in files:
                if name.endswith((".h", ".inc")):
                    src = os.path.join(folder, name)
                    dst = os.path.join(include, os.path.relpath(src, os.path.join(root, base)))
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                    shutil.copyfile(src, dst)  # a new time: dependants rebuild
    utf8 = os.path.join(root, "third_party/protobuf/third_party/utf8_range")
    for name in ("utf8_range.h", "utf8_validity.h"):
        shutil.copyfile(os.path.join(utf8, name), os.path.join(include, name))


# --- the generated classes ---------------------------------------------------------------------

def onnx_proto() -> str:
    given = os.environ.get("ONNX_PROTO")
    if given:
        return given
    import importlib.util
    spec = importlib.util.find_spec("onnx")  # found, not imported: only its onnx.proto is needed
    if spec is None or not spec.submodule_search_locations:
        raise BuildError("cannot find the onnx package for its onnx.proto: pip install onnx, or "
                         "set ONNX_PROTO")
    return os.path.join(list(spec.submodule_search_locations)[0], "onnx.proto")


def generate() -> None:
    proto = onnx_proto()
    if not os.path.exists(proto):
        raise BuildError(f"onnx.proto not found at {proto}")
    with open(proto) as f:
        text = f.read()
    # Only the package changes; LITE_RUNTIME is added when the file does not already ask for it.
    text, n = re.subn(r"^package onnx;", "package torch_ort_onnx;", text, flags=re.MULTILINE)
    if n != 1:
        raise BuildError(f"no 'package onnx;' line in {proto}")
    if not re.search(r"^option optimize_for = LITE_RUNTIME;", text, re.MULTILINE):
        text += "\noption optimize_for = LITE_RUNTIME;\n"
    text += f"// protoc: protobuf from grpcio-tools {GRPC_TOOLS_VERSION}\n"  # a new protoc regenerates
    os.makedirs(GENERATED, exist_ok=True)
    target = os.path.join(GENERATED, "torch_ort_onnx.proto")
    outputs = [os.path.join(GENERATED, f"torch_ort_onnx.pb.{ext}") for ext in ("h", "cc")]
    if os.path.exists(target) and all(map(os.path.exists, outputs)):
        with open(target) as f:
            if f.read() == text:
                return
    with open(target, "w") as f:
        f.write(text)
    result = subprocess.run([PROTOC, f"--proto_path={GENERATED}", f"--cpp_out={GENERATED}", target])
    if result.returncode != 0:
        raise BuildError(f"protoc failed on {target} (exit {result.returncode})")
    log(f"generated {GENERATED}/torch_ort_onnx.pb.{{h,cc}} from {proto}")


def generate_op_arity() -> None:
    """The ONNX rows of the core's arity table, from the same onnx package (gen_op_arity.py)."""
    spec = importlib.util.spec_from_file_location("torch_ort_gen_op_arity",
                                                  os.path.join(ROOT, "scripts", "gen_op_arity.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.generate(GENERATED)
    except ImportError as e:
        raise BuildError(f"generating the ONNX arity table needs the onnx package ({e}): pip install onnx") from e


def ensure(jobs: int | None = None) -> None:
    """Everything the C++ build needs generated: protobuf-lite, the ONNX message classes and the
    ONNX arity table; quick when they are already there."""
    jobs = jobs or int(os.environ.get("MAX_JOBS", "2"))
    build_library(jobs)
    generate()
    generate_op_arity()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-j", "--jobs", type=int, default=None, help="parallel compile jobs")
    args = parser.parse_args()
    try:
        ensure(args.jobs)
    except BuildError as e:
        print(f"[build_protobuf] error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
