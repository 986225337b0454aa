"""torch_ort's compiled extension loads on first use and says clearly when the running torch is not
the one it was compiled against (torch_ort/_extension.py)."""
import subprocess
import sys

import pytest
import torch

from torch_ort import _extension
from torch_ort._extension import TorchVersionError


def test_a_torch_of_another_minor_release_names_both_and_the_fix():
    with pytest.raises(TorchVersionError, match=r"compiled against torch 2\.13\.1, but torch 2\.15\.0 is running") as e:
        _extension.check(running="2.15.0", built="2.13.1")
    assert _extension.REBUILD in str(e.value)
    _extension.check(running="2.15.2+cu130", built="2.15.0")  # another patch release loads


def test_a_torch_outside_the_supported_range_is_refused():
    with pytest.raises(TorchVersionError, match=r"supports torch 2\.11 to 2\.15; this is torch 2\.16\.0 "
                                                r"\(torch_ort was compiled against torch 2\.15\.0\)"):
        _extension.check(running="2.16.0", built="2.15.0")
    with pytest.raises(TorchVersionError, match=r"this is torch 2\.10\.1"):
        _extension.check(running="2.10.1", built="")


def test_this_build_recorded_the_running_torch():
    assert _extension.built_against() == torch.__version__


def _run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_recorded_build_version_that_differs_fails_the_first_use_clearly():
    """import torch_ort loads nothing compiled; the first use of the extension checks the record."""
    done = _run("import sys, types\n"
                "info = types.ModuleType('torch_ort._build_info'); info.TORCH_VERSION = '2.12.0'\n"
                "sys.modules['torch_ort._build_info'] = info\n"
                "import torch, torch_ort\n"
                "assert 'torch_ort._C' not in sys.modules\n"
                "model = torch_ort.ORTModule(torch.nn.Linear(2, 2))\n"
                "model(torch.randn(3, 2))\n")
    assert done.returncode != 0
    assert "TorchVersionError: torch_ort was compiled against torch 2.12.0, but torch " in done.stderr, done.stderr
    assert _extension.REBUILD in done.stderr


def test_the_supported_range_is_the_one_pip_is_told():
    """scripts/build_backend.py states the range to pip (and the sdist), _extension.SUPPORTED to
    the running process: the two say the same."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).parents[2] / "scripts" / "build_backend.py"
    spec = importlib.util.spec_from_file_location("torch_ort_build_backend_check", path)
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    (lo_major, lo_minor), (hi_major, hi_minor) = _extension.SUPPORTED
    assert backend.TORCH == f"torch>={lo_major}.{lo_minor},<{hi_major}.{hi_minor + 1}"
