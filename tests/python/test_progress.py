"""Progress of a slow first step on stderr: silent when quick, stage lines and a summary when not,
off with ORTMODULE_PROGRESS=0."""
import io
import time

import torch

from torch_ort import ORTModule
from torch_ort.ortmodule.engine import progress


def test_quick_preparation_prints_nothing():
    out = io.StringIO()
    p = progress.Progress("M", True, stream=out, delay=5.0)
    p.stage("exporting")
    p.finish()
    assert out.getvalue() == ""


def test_slow_preparation_prints_stages_and_their_times():
    out = io.StringIO()
    p = progress.Progress("M", True, stream=out, delay=0.05)
    p.stage("exporting")
    time.sleep(0.2)  # past the delay: the current stage is shown
    p.stage("building the training engine")
    p.stage("exporting", "blocks.1")
    p.finish()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("torch_ort: M: exporting (") and "ORTMODULE_PROGRESS=0" in lines[0]
    assert lines[1] == "torch_ort: M: building the training engine"
    assert lines[2] == "torch_ort: M: blocks.1: exporting"
    # the summary sums a stage over the submodules that went through it
    assert lines[3].startswith("torch_ort: M: ready in ") and "exporting 0.2 s" in lines[3]
    assert "building the training engine" in lines[3] and len(lines) == 4


def test_disabled_prints_nothing():
    out = io.StringIO()
    p = progress.Progress("M", False, stream=out, delay=0.0)
    p.stage("exporting")
    time.sleep(0.05)
    p.finish()
    assert out.getvalue() == ""


def _train_once(model, x):
    model(x).sum().backward()


def test_first_step_reports_on_stderr(monkeypatch, capfd):
    monkeypatch.setattr(progress, "DELAY", 0.0)
    model = ORTModule(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)))
    x = torch.randn(3, 4)
    _train_once(model, x)
    time.sleep(0.05)
    err = capfd.readouterr().err
    assert "torch_ort: Sequential: " in err and "exporting" in err
    assert "building the training engine" in err and "Sequential: ready in " in err
    _train_once(model, x)  # a steady step: nothing
    assert "torch_ort:" not in capfd.readouterr().err


def test_variable_turns_it_off(monkeypatch, capfd):
    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.setenv("ORTMODULE_PROGRESS", "0")
    model = ORTModule(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)))
    _train_once(model, torch.randn(3, 4))
    assert "torch_ort:" not in capfd.readouterr().err
