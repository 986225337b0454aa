"""Packaging: the sdist holds every input of the build, and the built extension keeps its private
protobuf and abseil to itself. (scripts/check_wheel.sh, the last step of scripts/test.sh, builds a
wheel from the sdist and trains through it in a fresh environment.)"""
import email
import os
import re
import subprocess
import sys
import tarfile

import pytest

import torch_ort

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    out = tmp_path_factory.mktemp("sdist")
    code = ("import sys; sys.path.insert(0, 'scripts'); import build_backend; "
            f"print(build_backend.build_sdist({str(out)!r}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    name = done.stdout.strip().splitlines()[-1]
    with tarfile.open(out / name) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name and m.isfile()}
        info = tar.extractfile(f"{name[:-len('.tar.gz')]}/PKG-INFO").read().decode()
    return name, members, email.message_from_string(info)


def test_the_sdist_holds_every_build_input(sdist):
    name, members, _ = sdist
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    inputs = [p for p in tracked
              if p.startswith(("csrc/", "scripts/", "torch_ort/", "tests/cpp/", "tests/fuzz/"))
              or p in ("setup.py", "pyproject.toml", "CMakeLists.txt", "LICENSE", "README.md",
                       "MANIFEST.in")]
    assert "csrc/core/ir/errors.h" in inputs and "scripts/build_protobuf.py" in inputs
    missing = [p for p in inputs if p not in members]
    assert not missing, f"{name} lacks {missing[:20]}"
    assert not [p for p in members if p.startswith("build/") or p.endswith((".so", ".o"))]


def test_the_sdist_is_for_any_torch_of_the_range(sdist):
    """The sources are not tied to a torch: plain version, the checked range (a wheel built from
    them names its torch: scripts/build_backend.py, setup.py)."""
    name, _, info = sdist
    # our own distribution name: torch_ort would normalise to torch-ort, ONNX Runtime's package
    assert info["Name"] == "torch-ort-engine" and name == f"torch_ort_engine-{torch_ort.__version__}.tar.gz"
    assert info["Version"] == torch_ort.__version__ and "+" not in info["Version"]
    requires = info.get_all("Requires-Dist")
    assert "torch<2.16,>=2.11" in requires or "torch>=2.11,<2.16" in requires, requires
    assert info["License-Expression"] == "MIT"


@pytest.mark.parametrize("module", ["_C", "_C_cuda"])
def test_the_extension_exports_no_protobuf_or_abseil_symbol(module):
    """libtorch exports a protobuf of its own: ours (and its abseil) must not interpose with it."""
    folder = os.path.dirname(torch_ort.__file__)
    found = [f for f in os.listdir(folder) if f.startswith(module + ".") and f.endswith(".so")]
    if module == "_C_cuda" and not found:
        pytest.skip("built without nvcc: no torch_ort._C_cuda")
    assert len(found) == 1, found
    symbols = subprocess.run(["nm", "-D", "--defined-only", "-C", os.path.join(folder, found[0])],
                             capture_output=True, text=True, check=True).stdout
    leaked = [line for line in symbols.splitlines() if re.search(r"google::protobuf|absl::|utf8_range", line)]
    assert not leaked, leaked[:10]
    assert "PyInit_" + module in symbols


def _setup_constant(name):
    """A constant of setup.py, read without running it (it builds when executed)."""
    import ast
    tree = ast.parse(open(os.path.join(ROOT, "setup.py")).read())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == name)
    return eval(compile(ast.Expression(node.value), "setup.py", "eval"), {"frozenset": frozenset})


@pytest.mark.parametrize("part", ["core", "runtime"])
def test_unity_groups_compile_in_any_grouping(part, tmp_path):
    """Installs compile the sources grouped several to a translation unit (setup.py's unity
    build), grouped by the machine's core count. All of them but setup.py's solo list compiled as
    ONE unit must compile: then every grouping does (no two file-local names collide)."""
    from torch.utils import cpp_extension
    import glob
    files = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", part, "**", "*.cc"), recursive=True)
                   if "/cuda/" not in p)
    solo = _setup_constant("CORE_SOLO") if part == "core" else frozenset()
    assert solo <= set(files), "CORE_SOLO names a file that no longer exists"
    unit = tmp_path / f"{part}.cc"
    unit.write_text("".join(f'#include "{f}"\n' for f in files if f not in solo))
    includes = [ROOT, os.path.join(ROOT, "build", "generated"), os.path.join(ROOT, "csrc", "proto"),
                os.path.join(ROOT, "build", "third_party", "protobuf-lite", "include")]
    if part == "runtime":
        includes += cpp_extension.include_paths()
        includes.append(__import__("sysconfig").get_paths()["include"])
    done = subprocess.run(["c++", "-std=c++20", "-fsyntax-only", "-fopenmp", "-DTORCH_API_INCLUDE_EXTENSION_H",
                           "-DTORCH_EXTENSION_NAME=_C", *(f"-I{i}" for i in includes), str(unit)],
                          capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stderr.splitlines() if ": error" in line]
    assert done.returncode == 0, "sources whose file-local names collide (add them to CORE_SOLO or " \
        "rename):\n" + "\n".join(errors[:10])
