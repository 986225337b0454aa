"""ORTMODULE_CACHE_DIR: a second process with the same model and schema skips export; bad
entries are rejected and rewritten; graphs with PythonOps are not cached."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from torch_ort import ORTModule

SCRIPT = textwrap.dedent("""
    import json, sys, time, torch
    from torch_ort import ORTModule
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    ours = ORTModule(model)
    x = torch.randn(8, 16)
    start = time.perf_counter()
    loss = ours(x).pow(2).mean()
    loss.backward()
    first = time.perf_counter() - start
    print(json.dumps({"exports": ours.export_count, "hits": ours.cache_hit_count,
                      "loss": loss.item(), "grad": model[0].weight.grad.sum().item(),
                      "first_step_s": first}))
""")


def _run(cache_dir):
    env = dict(os.environ, ORTMODULE_CACHE_DIR=str(cache_dir), ORTMODULE_FALLBACK_POLICY="FALLBACK_DISABLE")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    import json
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_skips_export(tmp_path):
    first, second = _run(tmp_path), _run(tmp_path)
    assert (first["exports"], first["hits"]) == (1, 0)
    assert (second["exports"], second["hits"]) == (0, 1)
    assert second["loss"] == first["loss"] and second["grad"] == first["grad"]
    assert len(list(tmp_path.glob("*.onnx"))) == 1


class Net(torch.nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.fc = torch.nn.Linear(4, width)

    def forward(self, x):
        return self.fc(x).relu().sum()


def test_in_process_hit_and_key_changes(strict, monkeypatch, tmp_path):
    monkeypatch.setenv("ORTMODULE_CACHE_DIR", str(tmp_path))
    a = ORTModule(Net())
    a(torch.randn(2, 4)).backward()
    b = ORTModule(Net())
    b(torch.randn(3, 4)).backward()
    assert (a.export_count, b.export_count, b.cache_hit_count) == (1, 0, 1)
    c = ORTModule(Net(width=9))            # another structure: another key
    c(torch.randn(2, 4)).backward()
    d = ORTModule(Net())                    # another schema (float64 input): another key
    d.double()
    d(torch.randn(2, 4, dtype=torch.float64)).backward()
    assert (c.export_count, d.export_count) == (1, 1)
    assert len(list(tmp_path.glob("*.json"))) == 3


@pytest.mark.parametrize("damage", ["truncate", "format"])
def test_damaged_entry_is_rejected_and_rewritten(strict, monkeypatch, tmp_path, damage):
    monkeypatch.setenv("ORTMODULE_CACHE_DIR", str(tmp_path))
    ORTModule(Net())(torch.randn(2, 4)).backward()
    onnx_file = next(tmp_path.glob("*.onnx"))
    json_file = onnx_file.with_suffix(".json")
    if damage == "truncate":
        onnx_file.write_bytes(onnx_file.read_bytes()[:50])
    else:
        json_file.write_text(json_file.read_text().replace('"format": 1', '"format": 99'))
    again = ORTModule(Net())
    torch.manual_seed(0)
    again(torch.randn(2, 4)).backward()
    assert (again.export_count, again.cache_hit_count) == (1, 0)
    fresh = ORTModule(Net())
    fresh(torch.randn(2, 4)).backward()
    assert fresh.cache_hit_count == 1   # the rewritten entry is good


def test_python_op_graphs_are_not_cached(strict, monkeypatch, tmp_path):
    from test_python_op import Net as FnNet

    monkeypatch.setenv("ORTMODULE_CACHE_DIR", str(tmp_path))
    ORTModule(FnNet("ste"))(torch.randn(2, 6)).backward()
    assert not list(tmp_path.glob("*.onnx"))
