"""Shared fixtures: models, and a strict fallback policy for every test (nothing may silently run in
eager PyTorch; tests of the fallback itself are marked `fallback`)."""
import copy
import json
import logging
import os
import socket
import sys
import tempfile
import time

import pytest
import torch
import torch.nn.functional as F

import torch_ort

import forkserver

# The optimizer kernels' CPU paths this processor has (tests run each).
OPTIM_CPU_PATHS = ["avx512", "portable"] if torch_ort._C.optim_cpu_path() == "avx512" else ["portable"]


@pytest.fixture(params=OPTIM_CPU_PATHS)
def cpu_path(request):
    """Runs the test once per CPU path of the optimizer kernels."""
    torch_ort._C.set_optim_cpu_path(request.param)
    yield request.param
    torch_ort._C.set_optim_cpu_path("auto")


@pytest.fixture(autouse=True)
def strict(request, monkeypatch):
    """Every test: any engine failure raises instead of falling back to eager PyTorch, so no engine
    test passes by running eager. Tests of the fallback (@pytest.mark.fallback) keep the default
    policy or set the one they test."""
    if request.node.get_closest_marker("fallback") is None:
        monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")


@pytest.fixture(autouse=True)
def branches_unexportable(request, monkeypatch):
    """Tests marked branches_unexportable use a Python `if` on a tensor's value as their example
    of a module torch.export cannot capture (the fallback, partial acceleration, error texts);
    with decisions taken from values (test_data_dependent.py) such a module exports whole."""
    if request.node.get_closest_marker("branches_unexportable") is not None:
        monkeypatch.setenv("ORTMODULE_EXPORT_DECISIONS_FROM_VALUES", "0")


@pytest.fixture(autouse=True)
def torch_ort_logger_state():
    """Every test: the torch_ort logger's level and rank filter are put back afterwards (a level
    asked for through DebugOptions or ORTMODULE_LOG_LEVEL stays set, as logging levels do)."""
    from torch_ort.ortmodule.policy.debug_options import LOGGER, RANK_FILTER
    level, every_rank = LOGGER.level, RANK_FILTER.every_rank
    yield
    LOGGER.setLevel(level)
    RANK_FILTER.every_rank = every_rank


@pytest.fixture
def torch_ort_log():
    """Every record the torch_ort logger emits during the test, at the level it has (set by
    DebugOptions(log_level=...) or ORTMODULE_LOG_LEVEL; else the root logger's, WARNING)."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("torch_ort")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


class MLPClassifier(torch.nn.Module):
    def __init__(self, d_in=12, hidden=32, classes=5):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.drop = torch.nn.Dropout(p=0.0)
        self.fc3 = torch.nn.Linear(hidden, classes)

    def forward(self, x, labels):
        h = torch.relu(self.fc1(x))
        h = self.drop(torch.tanh(self.fc2(h)))
        logits = self.fc3(h)
        return F.cross_entropy(logits, labels), logits


class Regressor(torch.nn.Module):
    def __init__(self, d_in=12, hidden=16):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, 1)

    def forward(self, x, target):
        pred = self.fc2(torch.sigmoid(self.fc1(x))).squeeze(-1)
        return F.mse_loss(pred, target), pred


def classifier_batch(n, d_in=12, classes=5, gen=None):
    return torch.randn(n, d_in, generator=gen), torch.randint(0, classes, (n,), generator=gen)


def regression_batch(n, d_in=12, gen=None):
    return torch.randn(n, d_in, generator=gen), torch.randn(n, generator=gen)


def twin(model_cls, seed=0, **kw):
    """Two identical models from one seed: one for eager, one to wrap."""
    torch.manual_seed(seed)
    a = model_cls(**kw)
    return a, copy.deepcopy(a)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_worker(worker: str, *args: str, world: int = 1, env: dict | None = None, cwd: str | None = None,
               out: str) -> None:
    """Runs a training worker script, with FALLBACK_DISABLE (nothing may silently run eager) and
    `env` added: one process, or `world` ranks started here with the variables torchrun would set
    (without torchrun's own process; the examples' tests run torchrun itself), each forked from
    the fork server (forkserver.py: its imports are done). A rank that fails stops the others;
    fails with each rank's output's tail."""
    cmd = [sys.executable, worker, *args, "--out", out]
    environ = {**os.environ, "ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE", **(env or {})}
    if world > 1:  # OMP_NUM_THREADS=1 as torchrun sets it for several ranks on one machine
        environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(world),
                       LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0")
        environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as logs:
        procs = []
        for rank in range(world):
            with open(os.path.join(logs, f"{rank}.out"), "w") as o, open(os.path.join(logs, f"{rank}.err"), "w") as e:
                rank_env = dict(environ, RANK=str(rank), LOCAL_RANK=str(rank)) if world > 1 else environ
                procs.append(forkserver.Popen(cmd, env=rank_env, stdout=o, stderr=e, text=True, cwd=cwd))
        deadline = time.monotonic() + 600
        while any(p.poll() is None for p in procs):
            if any(p.returncode for p in procs) or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                break
            time.sleep(0.05)
        codes = [p.wait() for p in procs]
        if any(codes):
            tails = []
            for rank, code in enumerate(codes):
                with open(os.path.join(logs, f"{rank}.out")) as o, open(os.path.join(logs, f"{rank}.err")) as e:
                    tails.append(f"--- rank {rank} of {world}: exit {code}\n{o.read()[-3000:]}\n{e.read()[-6000:]}")
            raise AssertionError(f"{' '.join(cmd)} failed:\n" + "\n".join(tails))


def read_result(path: str) -> dict:
    """A worker's JSON result, removed once read."""
    with open(path) as f:
        result = json.load(f)
    os.remove(path)
    return result


def assert_same_training(a: dict, b: dict, rtol=1e-5, atol=1e-6):
    """Two workers' results: per-step losses and final parameters (by name) within tolerance."""
    torch.testing.assert_close(torch.tensor(a["losses"]), torch.tensor(b["losses"]), rtol=rtol, atol=0)
    assert a["params"].keys() == b["params"].keys()
    for name in a["params"]:
        torch.testing.assert_close(torch.tensor(a["params"][name]), torch.tensor(b["params"][name]),
                                   rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
