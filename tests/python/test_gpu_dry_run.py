"""The GPU check as the GPU machine would run it, up to each process's first CUDA call
(scripts/gpu_dry_run.py): a copy of the tree plus what docs/gpu.md says to carry, a bare python3
without our .pth, no network. Every part of both profiles must reach the GPU; and the environment
must really be that bare, or the check proves nothing."""
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("gpu_dry_run", os.path.join(ROOT, "scripts", "gpu_dry_run.py"))
gpu_dry_run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_dry_run)


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    return gpu_dry_run.stage(str(tmp_path_factory.mktemp("gpu_machine")))


def run_there(staged, *argv, extra=None):
    tree, env, prefix = staged
    return subprocess.run([*prefix, *argv], cwd=tree, env=dict(env, **(extra or {})), capture_output=True,
                          text=True, timeout=600)


def test_the_staged_python_sees_torch_but_not_torch_ort(staged):
    """Without the PYTHONPATH gpu_check.sh sets, an example cannot import torch_ort there: the dry
    run's environment is the GPU machine's, not this checkout's .venv."""
    r = run_there(staged, "python3", "examples/getting_started.py", "--help")
    assert r.returncode != 0 and "No module named 'torch_ort'" in r.stderr, r.stderr[-2000:]
    r = run_there(staged, "python3", "-c", "import torch, sys; print(torch.cuda.is_available(), sys.prefix)")
    assert r.returncode == 0 and r.stdout.startswith("True "), r.stderr[-2000:]
    assert not r.stdout.split()[1].startswith(ROOT)


def test_the_staged_machine_has_no_network(staged):
    r = run_there(staged, "python3", "-c",
                  "import urllib.request; urllib.request.urlopen('https://pypi.org/simple/', timeout=5)")
    assert r.returncode != 0 and ("URLError" in r.stderr or "OSError" in r.stderr), r.stderr[-2000:]


def test_the_first_cuda_call_ends_a_process_with_the_mark(staged):
    r = run_there(staged, "python3", "-c", "import torch; print('before'); torch.zeros(1, device='cuda')")
    assert r.returncode == 87 and r.stdout.strip() == "before"
    assert gpu_dry_run.DRY_RUN_MARK in r.stderr


@pytest.fixture(scope="module")
def dry_runs(staged):
    """Both profiles of the GPU check, run at once (each mostly waits on imports and children)."""
    tree, env, prefix = staged
    runs = {}
    for profile in ("first", "second"):
        out = os.path.join(os.path.dirname(tree), f"out-{profile}")
        proc = subprocess.Popen([*prefix, "bash", "scripts/gpu_check.sh", "--dry-run", "--profile", profile,
                                 "--budget", "1800"], cwd=tree, env=dict(env, OUT=out), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        runs[profile] = (proc, out)
    results = {}
    for profile, (proc, out) in runs.items():
        log = proc.communicate(timeout=900)[0]
        with open(os.path.join(out, "summary.md")) as f:
            results[profile] = (proc.returncode, f.read(), log)
    return results


@pytest.mark.parametrize("profile", ["first", "second"])
def test_every_part_of_the_gpu_check_reaches_the_gpu(dry_runs, profile):
    rc, summary, log = dry_runs[profile]
    assert rc == 0, summary + log[-3000:]
    rows = [line for line in summary.splitlines() if line.startswith("| ") and not line.startswith("| part")]
    assert rows and all(" passed" in row for row in rows), summary
    # Each process of a test or an example part stopped at the GPU (the benchmarks' parent, which
    # never touches it, checks its children itself and exits 0).
    stopped = [row for row in rows if not row.startswith(("| build ", "| bench", "| probe "))]
    assert stopped and all("reached the GPU" in row for row in stopped), summary
    print(summary, file=sys.stderr)
