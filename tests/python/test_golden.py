"""The golden GPT-2 trajectory (scripts/record_golden.py, recorded under eager PyTorch) replayed
through ORTModule with nothing falling back: 50 per-step losses within rtol 1e-4 and the last
step's gradients within rtol 1e-3 / atol 1e-5."""
import importlib.util
from pathlib import Path

import pytest
import torch

from torch_ort import ORTModule

ROOT = Path(__file__).resolve().parents[2]
LOSS_RTOL = 1e-4
GRAD_TOL = dict(rtol=1e-3, atol=1e-5)


def _recorder():
    spec = importlib.util.spec_from_file_location("record_golden", ROOT / "scripts" / "record_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def golden():
    rec = _recorder()
    data = torch.load(rec.GOLDEN, weights_only=True)
    assert data["format"] == 1
    return rec, data


def replay(golden_pair, wrap):
    """Returns the model, the losses, the final gradients and, under ORTModule, the export count
    after every step."""
    rec, data = golden_pair
    model = rec.build_model(data["config"], data["initial_state"])
    exports = []
    if wrap:
        model = ORTModule(model)
    on_step = (lambda step: exports.append(model.export_count)) if wrap else None
    losses, grads = rec.train(model, data["inputs"], data["optim"], on_step)
    return model, losses, grads, exports


def check(losses, grads, data):
    expected = data["losses"].tolist()
    assert len(losses) == len(expected)
    for step, (got, want) in enumerate(zip(losses, expected)):
        assert got == pytest.approx(want, rel=LOSS_RTOL), f"step {step}: {got} vs golden {want}"
    assert grads.keys() == data["final_grads"].keys()
    for name, want in data["final_grads"].items():
        torch.testing.assert_close(grads[name], want, **GRAD_TOL, msg=lambda m: f"{name}: {m}")


def test_golden_file_is_small_and_learns(golden):
    rec, data = golden
    assert Path(rec.GOLDEN).stat().st_size < 1 << 20
    assert data["losses"][-1] < 0.7 * data["losses"][0]  # a trajectory worth replaying


def test_golden_replays_in_eager(golden):
    """Guards the recording itself: if this fails, torch or transformers changed, not torch_ort."""
    _, losses, grads, _ = replay(golden, wrap=False)
    check(losses, grads, golden[1])


def test_golden_replays_through_ortmodule(strict, golden):
    model, losses, grads, exports = replay(golden, wrap=True)
    check(losses, grads, golden[1])
    assert exports == [exports[0]] * len(exports)  # every export happened in the first step
