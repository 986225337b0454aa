"""benchmarks/memory.py: the largest-batch search on a fake runner, the goals and report
of a fabricated result, and one real `--quick` run (tiny GPT, eager and ORTModule level 0) whose
JSON must hold positive, mutually consistent measurements. No timing is asserted."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import memory  # noqa: E402
import memory_render  # noqa: E402

MIB = 1 << 20


class FakeRunner:
    """A model whose peak RSS is 1000 MiB + 100 MiB per batch element."""

    def __init__(self):
        self.batches = []

    def run(self, case, variant, batch, steps, warmup, profile=True, cap_gb=None):
        self.batches.append(batch)
        peak = 1000 + 100 * batch
        if cap_gb is not None and peak > cap_gb * 1024:
            return {"error": f"killed: RSS {peak / 1024:.2f} GiB over the {cap_gb:g} GiB cap", "wall_s": 1.0}
        return {"process_peak_rss_mib": peak, "wall_s": 1.0}


def test_largest_batch_doubles_then_bisects():
    runner = FakeRunner()  # 3 GiB = 3072 MiB: batch 20 fits (3000), 21 does not
    s = memory.largest_batch(runner, "tiny", "eager", 3.0, {4: 1400.0, 8: 1800.0}, max_probes=10)
    assert (s["largest"], s["first_not_fitting"], s["exact"]) == (20, 21, True)
    assert runner.batches == [16, 32, 24, 20, 22, 21]  # the sweep's 4 and 8 are not run again
    assert [p["fits"] for p in s["probes"]] == [True, False, False, True, False, False]


def test_largest_batch_stops_at_the_probe_limit_and_when_nothing_fits():
    s = memory.largest_batch(FakeRunner(), "tiny", "eager", 3.0, {}, max_probes=3)
    assert (s["largest"], s["exact"], s["stopped"]) == (4, False, "probe limit (3) reached")
    s = memory.largest_batch(FakeRunner(), "tiny", "eager", 0.5, {}, max_probes=3)
    assert (s["largest"], s["first_not_fitting"], s["exact"]) == (0, 1, True)


def _row(act_mib, step_s, predicted_mib=None, rows=()):
    r = {"batch": 8, "process_peak_rss_mib": 2000.0, "median_step_s": step_s, "times_s": [step_s] * 3,
         "rss_method": "VmHWM",
         "rss": {"before_mib": 1500.0, "activation_mib": act_mib * 1.02, "step_peak_mib": 1500.0 + act_mib},
         "allocator": {"peak_mib": act_mib, "forward_peak_mib": act_mib / 2}, "ort": None}
    if predicted_mib is not None:
        r["ort"] = {"level": 0, "predicted": {"peak": int(predicted_mib * MIB)},
                    "measured": {"peak": int(act_mib * MIB)}, "rows": list(rows)}
    return r


def fabricated() -> dict:
    plan = dict(memory.PLANS["baby"], cap_gb=4.0, case_batch=8, batches=[8])
    rows = [{"cluster": "Gelu+", "strategy": 1, "occurrences": 6, "enabled": 6, "bytes_saved": 60 * MIB}]
    sweep = {"eager": {"8": _row(1000, 1.0)}, "compile": {"8": _row(800, 0.7)},
             "ort0": {"8": _row(650, 0.6, predicted_mib=680)},          # 0.65× eager, predicted 1.05×
             "ort1": {"8": _row(450, 0.72, predicted_mib=380, rows=rows)},  # 0.45×, +20%, predicted 0.84×
             "ort2": {"8": {"error": "RuntimeError: boom", "wall_s": 1.0}}}
    cap = {v: {"largest": n, "first_not_fitting": n + 1, "exact": True, "probes": [], "known_from_sweep": {}}
           for v, n in (("eager", 20), ("ort0", 30), ("ort1", 44))}
    return {"date": "2026-11-23 16:00 UTC", "machine": "x86_64, 2 cores", "cpu": "test CPU", "cores": 2,
            "malloc": {"MALLOC_MMAP_THRESHOLD_": "65536"}, "command": "benchmarks/memory.py",
            "cases": {"baby": {"config": {k: v for k, v in memory.CASES["baby"].items() if k != "batch"},
                               "plan": plan, "cap_variants": list(cap), "sweep": sweep, "cap": cap}}}


def test_goals_judge_each_figure():
    met = {g: (m, ok) for g, m, _, ok in memory_render.goals(fabricated())}
    assert met["baby GPT: predicted peak ÷ measured (allocator), every level and batch"] == (
        "0.84–1.05× (2 rows; worst ORTModule level 1, batch 8)", False)
    assert met["baby GPT: ORTModule level 0 activations ÷ eager's"] == ("0.65× (worst batch, 8; RSS 0.65×)", True)
    assert met["baby GPT: ORTModule level 1 activations ÷ eager's"][1] is False  # 0.45× > 0.40×
    assert met["baby GPT: level 1 step time over level 0's (batch 8, medians)"] == (
        "+20% (fastest steps: +20%)", True)
    assert met["baby GPT: largest batch under 4 GiB, best level ÷ eager's"] == (
        "2.20× (ORTModule level 1 44, eager 20)", True)


def test_cap_goal_is_undecided_when_the_ranges_straddle_it():
    result = fabricated()
    cap = result["cases"]["baby"]["cap"]
    cap["eager"].update(exact=False, first_not_fitting=30, stopped="probe limit (4) reached")  # 20–29
    goal = memory_render.goals(result)[-1]
    assert goal[1:] == ("1.52–2.20× (ORTModule level 1 44, eager 20–29)", "≥ 2.0×", "undecided")
    cap["ort1"].update(exact=False, first_not_fitting=None)  # ≥ 44; stopped at its limit too
    cap["eager"].update(first_not_fitting=21)
    assert memory_render.goals(result)[-1][1:] == ("≥ 2.20× (ORTModule level 1 ≥ 44, eager 20)", "≥ 2.0×", True)
    assert "| eager | 20 (probe limit (4) reached) | 1.00× |" in "\n".join(memory_render.markdown(result))


def test_markdown_and_files(tmp_path):
    lines = memory_render.write(fabricated(), str(tmp_path))
    text = "\n".join(lines)
    assert "| ORTModule level 2 | 8 | failed: RuntimeError: boom |" in text
    assert "| ORTModule level 1 | 8 | 2,000 MiB | 1,950 MiB | 1,500 MiB | 459 MiB | 450 MiB | 0.45× | 380 MiB | 0.84× " in text
    assert "1 of 1 plans (60 MiB)" in text
    assert "| ORTModule level 1 | 44 | 2.20× |" in text
    assert json.loads((tmp_path / "memory.json").read_text())["cases"]["baby"]["cap"]["eager"]["largest"] == 20
    assert (tmp_path / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_merge_combines_cases_and_variants():
    a, b, c = fabricated(), fabricated(), fabricated()
    b["cases"] = {"gpt2": b["cases"].pop("baby")}
    b["command"] = "benchmarks/memory.py --cases gpt2"
    a["cases"]["baby"]["sweep"] = {"eager": a["cases"]["baby"]["sweep"]["eager"]}  # run apart
    a["cases"]["baby"]["cap"] = {"eager": a["cases"]["baby"]["cap"]["eager"]}
    c["cases"]["baby"]["sweep"].pop("eager")
    c["cases"]["baby"]["cap"].pop("eager")
    merged = memory_render.merge([a, b, c])
    assert list(merged["cases"]) == ["baby", "gpt2"]
    assert list(merged["cases"]["baby"]["sweep"]) == ["eager", "compile", "ort0", "ort1", "ort2"]
    assert merged["cases"]["baby"]["cap"] == fabricated()["cases"]["baby"]["cap"]
    assert merged["command"] == "benchmarks/memory.py ; benchmarks/memory.py --cases gpt2"


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("memory")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "memory.py"), "--quick",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (out / "memory.partial.json").exists()
    return json.loads((out / "memory.json").read_text())


def test_quick_run_measures_eager_and_level_0(quick):
    entry = quick["cases"]["tiny"]
    assert set(entry["sweep"]) == {"eager", "ort0"} and entry["plan"]["batches"] == [4, 8]
    for variant, rows in entry["sweep"].items():
        for batch, r in rows.items():
            assert "error" not in r, (variant, batch, r.get("log_tail", "")[-2000:])
            assert r["batch"] == int(batch) and r["last_loss"] > 0 and len(r["times_s"]) == 2
            rss, alloc = r["rss"], r["allocator"]
            assert r["process_peak_rss_mib"] >= rss["peak_mib"] > rss["before_mib"] > 100
            assert 0 < alloc["forward_peak_mib"] <= alloc["peak_mib"] < 1024
            # Freed blocks go back to the OS (MALLOC_MMAP_THRESHOLD_), so RSS follows the allocator.
            assert 0.5 * alloc["peak_mib"] < rss["activation_mib"] < 2 * alloc["peak_mib"] + 16
        small, large = rows["4"]["allocator"]["peak_mib"], rows["8"]["allocator"]["peak_mib"]
        assert 1.5 * small < large < 2.5 * small  # activations scale with the batch
    ort = entry["sweep"]["ort0"]["8"]["ort"]
    assert ort["level"] == 0
    if "error" not in ort:  # the memory report exists in this build
        assert ort["predicted"]["peak"] > 0 and ort["measured"]["peak"] > 0
    for variant in ("eager", "ort0"):
        s = entry["cap"][variant]
        assert s["largest"] >= 8 and len(s["probes"]) <= 1  # tiny GPT is far under 1.5 GiB
    text = (memory_render.markdown(quick))
    assert any(line.startswith("| tiny GPT: ORTModule level 0 activations ÷ eager's | ") for line in text)
