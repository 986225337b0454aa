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


def test_huggingface_gpt2_smoke(tmp_path):
    """The README's main command, shortened: GPT-2 pre-trained on the stdlib's code, checkpointed,
    reloaded and fine-tuned on Python's docs, in two processes (ORTModule, eager): the same losses
    and perplexities, the docs' perplexity falls with fine-tuning, the checkpoint round-trips."""
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "huggingface_gpt2.py"), "--steps", "12",
                          "--finetune-steps", "6", "--eval-batches", "1", "--data-mb", "0.5", "--quiet",
                          "--out-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    out = run.stdout
    assert run.returncode == 0, out[-3000:] + run.stderr[-3000:]
    assert "falling back" not in run.stderr and "FELL BACK" not in out, run.stderr + out
    table = {cells[1].strip(): [c.strip() for c in cells[2:4]]
             for cells in (line.split("|") for line in out.splitlines() if line.startswith("| "))}
    ours, eager = (float(v) for v in table["docs perplexity: pre-trained"])
    assert abs(ours - eager) < 1e-3 * eager
    assert table["docs perplexity: loaded from checkpoint"] == table["docs perplexity: pre-trained"]
    after = float(table["docs perplexity: fine-tuned"][0])
    assert after < ours  # fine-tuning on the docs lowers their perplexity
    first, last = (float(v) for v in table["pre-training loss (first -> last)"][0].split(" -> "))
    assert last < first
    diff = float(re.search(r"max \|loss difference\| (\S+)", out).group(1))
    assert diff < 1e-4, out
    pretrain, evaluated = (int(v) for v in re.search(
        r"ORTModule exports: (\d+) while pre-training, (\d+) after evaluation", out).groups())
    assert evaluated == pretrain + 1, out  # no re-export while training; eval mode is its own graph
    assert (tmp_path / "loss.png").stat().st_size > 10_000
    assert (tmp_path / "checkpoint-ortmodule" / "config.json").exists()


def test_ddp_training_smoke(tmp_path):
    """The README's distributed command, shortened: two gloo processes train through the engine
    with the load-balancing samplers and save a checkpoint on rank 0, which a one-process run then
    resumes from (its first loss is the trained one, not a fresh model's)."""
    ckpt = tmp_path / "ddp.pt"
    env = {**__import__("os").environ, "ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE"}
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(ROOT / "examples" / "ddp_training.py"), "--steps", "20", "--data-mb", "0.3",
                          "--checkpoint", str(ckpt), "--device", "cpu"],  # gloo, also where a GPU is
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
                          "--data-mb", "0.3", "--resume", str(ckpt), "--device", "cpu"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-4000:]
    resumed = float(re.search(r"^step\s+1\s+loss (\S+)", one.stdout, re.MULTILINE).group(1))
    assert resumed < losses[0] - 0.3, (one.stdout, losses)


def test_bert_pretraining_smoke_and_exact_resume(tmp_path):
    """The BERT example, shortened: it trains through the engine (bf16, FusedLamb, accumulation),
    and a run stopped at step 3 and resumed from its checkpoint ends at the uninterrupted run's loss."""
    env = {**__import__("os").environ, "ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE"}
    base = [sys.executable, str(ROOT / "examples" / "bert_pretraining.py"), "--steps", "6", "--accum", "2",
            "--batch", "8", "--log-every", "1", "--checkpoint-every", "100", "--device", "cpu"]

    def run(*extra, ckpt):
        done = subprocess.run([*base, "--checkpoint-dir", str(ckpt), *extra], capture_output=True, text=True,
                              timeout=600, cwd=ROOT, env=env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        return [float(v) for v in re.findall(r"^step\s+\d+\s+loss (\S+)", done.stdout, re.MULTILINE)], done.stdout

    whole, out = run(ckpt=tmp_path / "a")
    assert "ORTModule + FusedLamb" in out and len(whole) == 6 and whole[-1] < whole[0], out
    assert re.search(r"\d+\.\d sequences/s", out)
    vocab = ("--vocab-file", str(tmp_path / "a" / "vocab.txt"))  # the same vocabulary (training it
    first, _ = run("--stop-after", "3", *vocab, ckpt=tmp_path / "b")  # again may order it differently)
    resumed, out = run("--resume", *vocab, ckpt=tmp_path / "b")
    assert "resumed from" in out and first == whole[:3]
    assert resumed == whole[3:], (resumed, whole)
