"""PyTorch Lightning with ORTModule inside the LightningModule (tests/python/lightning_worker.py):
per-step losses and final parameters match the same LightningModule without ORTModule (rtol 1e-5),
in one process and in two (Lightning's "ddp" strategy, gloo on the CPU); a checkpoint saved by
trainer.save_checkpoint and resumed by Trainer.fit(ckpt_path=...) into a differently initialised
module continues the uninterrupted run's trajectory. The engine runs (no fallback)."""
import functools
import json
import os
import sys

import pytest
import torch
from conftest import assert_same_training, run_worker

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lightning_worker  # noqa: E402

WORKER = lightning_worker.__file__


def assert_engine_ran(result: dict):
    assert result["fallback"] is None
    assert result["export_count"] >= 1


@pytest.mark.parametrize("optim", ["fused_adam", "sgd"])
def test_one_process_matches_eager(tmp_path, optim):
    ours = lightning_worker.run("ort", 1, 2, 0, optim, str(tmp_path / "ort.json"))
    eager = lightning_worker.run("eager", 1, 2, 0, optim, str(tmp_path / "eager.json"))
    assert len(ours["losses"]) == 8  # 2 epochs of 4 batches
    assert_same_training(ours, eager)
    assert_engine_ran(ours)
    assert list(ours["params"]) == ["net.fc1.weight", "net.fc1.bias", "net.fc2.weight", "net.fc2.bias",
                                    "net.fc3.weight", "net.fc3.bias"]  # the original's keys under `net.`


def test_one_process_checkpoint_resumes_the_trajectory(tmp_path):
    """Saved after epoch 1, loaded into a module built from another seed (weights and FusedAdam's
    moments come from the checkpoint): the same losses and parameters as the uninterrupted run."""
    whole = lightning_worker.run("ort", 1, 2, 0, "fused_adam", str(tmp_path / "whole.json"))
    resumed = lightning_worker.run("ort", 1, 2, 1, "fused_adam", str(tmp_path / "resumed.json"))
    assert (tmp_path / "resumed.json.ckpt").exists()
    assert_same_training(resumed, whole)
    assert_engine_ran(resumed)


@functools.lru_cache(maxsize=None)
def run_two(engine: str, resume_after: int, tmp: str) -> list[dict]:
    out = os.path.join(tmp, f"two_{engine}_{resume_after}.json")
    # Lightning's "ddp" re-runs this script for rank 1 itself: one process launched here.
    run_worker(WORKER, "--engine", engine, "--devices", "2", "--epochs", "2",
               "--resume-after", str(resume_after), cwd=tmp, out=out)
    results = []
    for rank in range(2):
        with open(f"{out}.rank{rank}") as f:
            results.append(json.load(f))
    return results


def test_two_processes_ddp_match_eager_and_resume(tmp_path):
    """devices=2, strategy="ddp" (Lightning re-runs the worker for rank 1): ORTModule, checkpointed
    after epoch 1 and resumed, against eager DDP uninterrupted; each rank's losses (its half of the
    data) and rank 0's final parameters."""
    ours = run_two("ort", 1, str(tmp_path))
    eager = run_two("eager", 0, str(tmp_path))
    assert [r["world"] for r in ours] == [2, 2] and [r["rank"] for r in ours] == [0, 1]
    for rank in range(2):
        assert len(ours[rank]["losses"]) == 4  # 2 epochs of 2 batches on each rank
        torch.testing.assert_close(torch.tensor(ours[rank]["losses"]), torch.tensor(eager[rank]["losses"]),
                                   rtol=1e-5, atol=0)
    assert ours[0]["losses"] != ours[1]["losses"]  # each rank trained on its own half
    assert_same_training(ours[0], eager[0])
    assert_engine_ran(ours[0])
