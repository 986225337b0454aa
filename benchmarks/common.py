"""What the benchmarks share: the optimizer benchmarks' command line, the machine line of their results, a report
that prints markdown and saves it with the JSON in benchmarks/results/, and the suites'
child processes: each variant runs alone, watched for memory and time; and the suites' report
figures (a measured row, a ratio between two, their formats)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_args(doc: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed rounds (medians over them)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    return parser.parse_args()


def machine() -> str:
    import torch  # here, not above: the suites' parent processes never load it
    return (f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"threads {torch.get_num_threads()}")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# --- child processes, each watched for memory and time (suite.py, memory.py) ---------------------
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a process prints when scripts/gpu_dry_run.py stops it at its first CUDA call.
DRY_RUN_MARK = "[gpu dry run] stopped at the first CUDA call"


def busy_cores(seconds: float = 1.0) -> float:
    """Cores kept busy by other processes over the next `seconds` (from /proc/stat; the suite's
    parent is idle meanwhile). Not the load average: that one-minute mean still counts the
    previous variant, which has just ended."""
    def sample():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait
    try:
        t0, i0 = sample()
        time.sleep(seconds)
        t1, i1 = sample()
    except OSError:  # not Linux: unknown
        return 0.0
    return (os.cpu_count() or 1) * (1 - (i1 - i0) / max(t1 - t0, 1))


def pooled_idle_bytes(model) -> int:
    """Bytes of large CPU buffers an ORTModule's engine holds idle for its next step
    (ORTMODULE_CPU_BUFFER_POOL): resident before a step yet the step's own memory, so a
    measurement of a step's memory as RSS growth adds them back (0 for other models)."""
    stats = getattr(model, "stats", None)
    return int(stats()["cpu_buffer_pool"]["idle_bytes"]) if stats is not None else 0


def run_watched(script: str, argv: list[str], max_rss_gb: float, timeout_s: float,
                env_extra: dict | None = None, own_rss_cap_gb: float | None = None) -> dict:
    """Runs `python script argv` with cold caches and env_extra set; returns the dict its last
    `RESULT {json}` line printed, or {"error": ...}. Killed when its process tree's RSS passes
    max_rss_gb, when its own RSS passes own_rss_cap_gb ("killed: RSS ... over the ... cap"), or
    after timeout_s. Without psutil (a bare interpreter on a machine with no package registry)
    only the time limit is enforced and the tree's peak RSS reads 0."""
    try:
        import psutil
    except ImportError:
        psutil = None
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(tmp, "triton"))
        env.pop("ORTMODULE_CACHE_DIR", None)  # a cached export would hide the first step's cost
        env.setdefault("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")  # never time eager as ours
        # This checkout's torch_ort, also where nothing installed it (a bare python3 on a GPU machine).
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        env.update(env_extra or {})
        out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        # Other work on the machine skews every figure: recorded (a dry run measures nothing).
        load = busy_cores() if os.environ.get("TORCH_ORT_GPU_DRY_RUN") != "1" else 0.0
        with open(out_path, "w") as out, open(err_path, "w") as err:
            start = time.perf_counter()
            proc = subprocess.Popen([sys.executable, script, *argv], stdout=out,
                                    stderr=err, cwd=_ROOT, env=env, start_new_session=True)
            killed, tree_peak = None, 0
            try:
                watched = psutil.Process(proc.pid) if psutil else None
                while proc.poll() is None:
                    rss = own = 0
                    try:
                        if watched:
                            own = watched.memory_info().rss
                            rss = own + sum(p.memory_info().rss for p in watched.children(recursive=True))
                    except psutil.Error:
                        pass  # a process ended between listing and reading
                    tree_peak = max(tree_peak, rss)
                    if own_rss_cap_gb is not None and own > own_rss_cap_gb * 2**30:
                        killed = f"killed: RSS {own / 2**30:.2f} GiB over the {own_rss_cap_gb:g} GiB cap"
                    elif rss > max_rss_gb * 2**30:
                        killed = f"killed: RSS {rss / 2**30:.2f} GiB over the {max_rss_gb:g} GiB limit"
                    elif time.perf_counter() - start > timeout_s:
                        killed = f"killed: still running after the {timeout_s:g} s timeout"
                    if killed:
                        break
                    time.sleep(0.1 if own_rss_cap_gb is not None else 0.2)
            finally:  # the child's session: it and its compile workers, nothing else
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass  # all of them ended already
                proc.wait()
            wall = time.perf_counter() - start
        with open(out_path) as f:
            stdout = f.read()
        with open(err_path) as f:
            stderr = f.read()
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if killed or proc.returncode != 0 or not lines:
        tail = (stderr or stdout).strip()[-2000:]
        return {"error": killed or (tail.splitlines() or [f"exit status {proc.returncode}"])[-1],
                "log_tail": tail, "wall_s": wall, "peak_tree_rss_mb": tree_peak / 2**20, "load_before": load}
    return dict(json.loads(lines[-1][len("RESULT "):]), wall_s=wall, peak_tree_rss_mb=tree_peak / 2**20,
                load_before=load)


class Report:
    """Markdown lines, printed as they come and saved with the JSON by save()."""

    def __init__(self, name: str):
        self.name = name
        self.lines: list[str] = []

    def out(self, line: str) -> None:
        print(line)
        self.lines.append(line)

    def save(self, result: dict) -> None:
        os.makedirs(RESULTS_DIR, exist_ok=True)
        result = dict(result, date=time.strftime("%Y-%m-%d"), machine=machine())
        with open(os.path.join(RESULTS_DIR, f"{self.name}.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(RESULTS_DIR, f"{self.name}.md"), "w") as f:
            f.write("\n".join(self.lines) + "\n")


def write_results(result: dict, out_dir: str, stem: str, markdown, chart) -> list[str]:
    """<stem>.json, <stem>.md (markdown(result) lines) and <stem>.png (chart(result, path)) in
    out_dir; returns the markdown lines."""
    os.makedirs(out_dir, exist_ok=True)
    lines = markdown(result)
    with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    chart(result, os.path.join(out_dir, f"{stem}.png"))
    return lines


# --- the suites' report figures (suite.py, gpu_suite.py): result["cases"][case]["variants"][variant]
def measured_row(result: dict, case: str, variant: str) -> dict | None:
    """A measured row, or None when the variant was not run or failed."""
    r = result["cases"].get(case, {}).get("variants", {}).get(variant)
    return r if r and "error" not in r else None


def ratio(result: dict, case: str, num: str, den: str, key: str = "median_step_s") -> float | None:
    """num's figure ÷ den's (so eager's time ÷ ours is our speed-up); None unless both were measured."""
    a, b = measured_row(result, case, num), measured_row(result, case, den)
    return a[key] / b[key] if a and b and b[key] else None


def times_text(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}×"


def percent_text(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}" if v < 0.1 else f"{v:.0%}"
