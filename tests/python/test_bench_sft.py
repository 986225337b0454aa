"""benchmarks/sft.py without running a model: its batches have the stated shares of padding,
prompt and counted labels, and its report (on a fabricated result) gives each variant's ratios
against eager and torch.compile and shows a failure."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import sft  # noqa: E402


def test_a_batch_counts_the_answers_only():
    case = sft.CASES["llama_sft_small"]
    ids, mask, labels = sft.batch(case, torch.Generator().manual_seed(0))
    b, t = case["batch"], case["seq"]
    assert ids.shape == mask.shape == labels.shape == (b, t)
    pad, prompt = int(t * sft.PADDING), int(t * sft.PROMPT)
    assert (mask[:, t - pad:] == 0).all() and (mask[:, :t - pad] == 1).all()
    counted = labels != -100
    assert not counted[:, :prompt].any() and not counted[:, t - pad:].any()
    assert torch.equal(labels[counted], ids[counted])
    assert abs(counted.float().mean().item() - 0.40) < 0.01


def _row(median, own, loss=11.2):
    return {"first_step_s": 2 * median, "median_step_s": median, "step_own_mb": own,
            "peak_tree_rss_mb": own + 3000, "last_loss": loss}


def test_the_report_gives_ratios_and_failures():
    result = {"case": "llama_sft", "steps": 4, "warmup": 1, "date": "2026-11-27", "machine": "x86_64, 2 cores",
              "cpu": "test CPU", "label_density": 0.4,
              "variants": {"eager": _row(28.0, 6000), "compile": _row(24.0, 6000), "ortmodule": _row(14.0, 3000),
                           "ortmodule_budget": {**_row(16.0, 1200), "memory_plan": "recompute level 0, LM-head "
                                                "chunks 32.0 MiB", "predicted_peak_mb": 1264.0,
                                                "engine_peak_mb": 1107.0},
                           "ortmodule_dense": {"error": "killed: RSS 21 GiB over the 20 GiB limit"}}}
    lines = sft.markdown(result)
    text = "\n".join(lines)
    assert "vocab 128,256" in text and "40% of labels counted" in text
    [ours] = [ln for ln in lines if ln.startswith("| ORTModule (default")]
    cells = [c.strip() for c in ours.split("|")]
    assert cells[4:6] == ["2.00×", "1.71×"]  # vs eager, vs torch.compile
    assert cells[7] == "0.50×"  # own memory ÷ eager's
    assert any("failed: killed: RSS 21 GiB" in ln for ln in lines)
    # The budget's row says which plan the planner chose, its prediction and the engine's measure.
    assert any("chose recompute level 0, LM-head chunks 32.0 MiB, predicted step peak 1,264 MiB; the "
               "engine measured 1,107 MiB" in ln for ln in lines)
