"""python -m torch_ort (and python -m torch_ort.configure): the installation report, exit 0 when
torch_ort works here and 1 when anything fails."""
import os
import subprocess
import sys

import torch

FAKE_BUILD = ("import sys, types\n"
              "info = types.ModuleType('torch_ort._build_info'); info.TORCH_VERSION = '2.12.0'\n"
              "sys.modules['torch_ort._build_info'] = info\n")


def _run(args, env=None):
    env = {**os.environ, **(env or {})}
    env.pop("ORTMODULE_FALLBACK_POLICY", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, env=env)


def test_python_m_torch_ort_reports_and_trains():
    done = _run(["-m", "torch_ort"], {"ORTMODULE_MEMORY_OPT_LEVEL": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for label in ("torch (running)", "torch (compiled against)", "onnx ", "onnxscript", "onnx-ir",
                  "torch_ort._C ", "CPU kernel path", "CUDA devices"):
        assert label in out, (label, out)
    assert f"torch (running)              {torch.__version__}" in out
    assert "ORTMODULE_MEMORY_OPT_LEVEL" in out and "'1' -> 1" in out  # as parsed
    assert "training step (cpu)          ok: loss and gradients match eager" in out
    assert out.rstrip().endswith("torch_ort works here.")


def test_configure_module_is_the_same_report():
    done = _run(["-m", "torch_ort.configure"])
    assert done.returncode == 0 and "torch_ort works here." in done.stdout, done.stdout + done.stderr


def test_a_broken_build_exits_nonzero_naming_the_failure():
    """A build recorded for another torch: the extension is refused, nothing trains, exit 1."""
    done = _run(["-c", FAKE_BUILD + "import runpy; runpy.run_module('torch_ort', run_name='__main__')"])
    assert done.returncode == 1, done.stdout + done.stderr
    assert "torch (compiled against)     2.12.0" in done.stdout
    assert "torch_ort._C                 FAILED: TorchVersionError: torch_ort was compiled against torch 2.12.0" \
        in done.stdout
    assert "training step" not in done.stdout and "torch_ort does not work here" in done.stdout


def test_an_invalid_variable_value_exits_nonzero():
    done = _run(["-m", "torch_ort"], {"ORTMODULE_MEMORY_OPT_LEVEL": "seven"})
    assert done.returncode == 1
    assert "ORTMODULE_* variables        FAILED" in done.stdout and "ORTMODULE_MEMORY_OPT_LEVEL" in done.stdout


def _fake_torch_ort_distribution(tmp_path):
    """A `torch-ort` distribution's metadata on the path, as ONNX Runtime's package leaves it."""
    info = tmp_path / "torch_ort-1.19.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-ort\nVersion: 1.19.2\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}


def test_import_warns_when_onnx_runtimes_torch_ort_is_installed_too(tmp_path):
    done = _run(["-c", "import torch_ort"], _fake_torch_ort_distribution(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "TorchOrtWarning" in done.stderr and "torch-ort 1.19.2 is installed beside torch-ort-engine" \
        in done.stderr
    assert "pip uninstall -y torch-ort onnxruntime-training" in done.stderr


def test_import_is_quiet_without_it():
    done = _run(["-c", "import torch_ort"])
    assert done.returncode == 0 and "torch-ort" not in done.stderr, done.stderr


def test_python_m_torch_ort_fails_on_the_conflicting_distribution(tmp_path):
    done = _run(["-m", "torch_ort"], _fake_torch_ort_distribution(tmp_path))
    assert done.returncode == 1
    assert "conflicting distribution     FAILED: torch-ort 1.19.2 installs the same import package" in done.stdout
