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
    _, _, info = sdist
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
