"""ORTModule inside DeepSpeed ZeRO stage 1 and 2 (PyPI DeepSpeed, CPU accelerator, 2 gloo
processes): with torch_ort's FusedAdam as the client optimizer, fp32 and bf16 (FP16_Optimizer
patching DeepSpeed's optimizer), it trains exactly as the eager model under the same engine."""
import json
import os
import sys

import pytest
import torch

import forkserver

SCRIPT = os.path.join(os.path.dirname(__file__), "deepspeed_ortmodule_run.py")


@pytest.fixture(scope="module")
def results():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", SCRIPT]
    env = dict(os.environ, DS_ACCELERATOR="cpu", ORTMODULE_FALLBACK_POLICY="FALLBACK_DISABLE")
    proc = forkserver.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[0][len("RESULTS "):])


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_ortmodule_under_deepspeed_zero_trains_as_eager(results, stage, precision):
    ours, eager = results[f"stage{stage}_{precision}_ort"], results[f"stage{stage}_{precision}_eager"]
    assert ours["wrapped"] == "ORTModule" and ours["optimizer"] == "DeepSpeedZeroOptimizer"
    assert ours["losses"][-1] < 0.8 * ours["losses"][0]  # it learns the batch
    rtol = 1e-5 if precision == "fp32" else 1e-2
    torch.testing.assert_close(torch.tensor(ours["losses"]), torch.tensor(eager["losses"]), rtol=rtol, atol=0)
    for a, b in zip(ours["params"], eager["params"]):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=rtol, atol=1e-5 if precision == "fp32" else 1e-2)
    assert ours["patched"] == ("deepspeed_zero" if precision == "bf16" else None)
