"""The README's main job runs: a short getting-started run trains, and matches eager."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_getting_started_smoke():
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "getting_started.py"), "--steps", "40"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, check=True)
    out = run.stdout
    assert "falling back" not in run.stderr, run.stderr  # trained through the engine
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s+\d+\s+[\d.]+\s+[\d.]+$", line)]
    eager, ours = [float(r[1]) for r in rows], [float(r[2]) for r in rows]
    assert ours[-1] < ours[0], out  # the loss falls
    assert "ORTModule exports: 2;" in out, out  # one per module mode: train, then eval
    diff = float(re.search(r"max \|loss difference\| over \d+ steps: (\S+)", out).group(1))
    assert diff < 1e-5, out
    assert eager[0] == ours[0]


def test_huggingface_gpt2_smoke():
    """The README's main command, shortened: GPT-2 on the stdlib's bytes trains in the engine."""
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "huggingface_gpt2.py"), "--steps", "12",
                          "--log-every", "4", "--eval-batches", "1", "--data-mb", "0.5"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT, check=True)
    out = run.stdout
    assert "falling back" not in run.stderr and "fell back" not in out, run.stderr + out
    logged = [float(v) for v in re.findall(r"^step\s+\d+\s+loss (\S+)\s+tokens/s [\d,]+$", out, re.MULTILINE)]
    assert len(logged) == 3, out
    first, last = (float(v) for v in re.search(r"loss (\S+) -> (\S+);", out).groups())
    assert last < first and logged[-1] == last, out  # the loss falls
    first, trained, evaluated = (int(v) for v in re.search(
        r"ORTModule exports: (\d+) in the first step, (\d+) after \d+ steps, (\d+) after evaluation", out).groups())
    assert first == trained and evaluated == trained + 1, out  # no re-export while training


def test_ddp_training_smoke(tmp_path):
    """The README's distributed command, shortened: two gloo processes train through the engine
    with the load-balancing samplers and save a checkpoint on rank 0, which a one-process run then
    resumes from (its first loss is the trained one, not a fresh model's)."""
    ckpt = tmp_path / "ddp.pt"
    env = {**__import__("os").environ, "ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE"}
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(ROOT / "examples" / "ddp_training.py"), "--steps", "20", "--data-mb", "0.3",
                          "--checkpoint", str(ckpt)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert two.returncode == 0, two.stdout[-2000:] + two.stderr[-4000:]
    out = two.stdout
    assert out.startswith("2 process(es) on CPU/gloo; ORTModule;"), out
    losses = [float(v) for v in re.findall(r"^step\s+\d+\s+loss (\S+)", out, re.MULTILINE)]
    assert len(losses) == 3 and losses[-1] < losses[0], out
    skew = float(re.search(r"max/min over ranks: median (\S+)", out).group(1))
    assert skew < 1.5, out  # the samplers keep the ranks' real tokens per step close
    assert ckpt.exists()
    one = subprocess.run([sys.executable, str(ROOT / "examples" / "ddp_training.py"), "--steps", "1",
                          "--data-mb", "0.3", "--resume", str(ckpt)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-4000:]
    resumed = float(re.search(r"^step\s+1\s+loss (\S+)", one.stdout, re.MULTILINE).group(1))
    assert resumed < losses[0] - 0.3, (one.stdout, losses)
