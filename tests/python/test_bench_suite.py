"""benchmarks/suite.py's report on a fabricated result (no model runs): the markdown names every
case and variant, the goals table judges each figure, failures show, and the chart is written."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import suite  # noqa: E402

PEAK = 100e9  # fp32 FLOP/s


def _row(first, median, loss=4.0, flops=50e9):
    return {"first_step_s": first, "median_step_s": median, "times_s": [median] * 10,
            "peak_rss_mb": 900.0, "last_loss": loss, "parameters": 1_000_000, "flops_per_step": flops}


def fabricated() -> dict:
    cases = {}
    for case in suite.CASES:  # ours: 2.5× eager, 1.25× compile, first step 10% of compile's
        cases[case] = {"steps": 3 if case == "gpt2" else 10, "warmup": 1, "variants": {
            "eager": _row(0.1, 1.0), "compile": _row(20.0, 0.5), "ortmodule": _row(2.0, 0.4),
            "ortmodule_fused": _row(2.0, 0.35, loss=4.5)}}
    cases["bert"]["variants"]["ortmodule"] = {"error": "RuntimeError: no kernel for op 'Foo'"}
    cases["baby"]["variants"]["ortmodule"]["median_step_s"] = 0.8  # 1.25× eager, MFU 62.5%
    shapes = [dict(s, float32=PEAK, bfloat16=2 * PEAK) for s in suite.gemm_shapes(list(suite.CASES))]
    return {"date": "2026-11-23", "machine": "x86_64, 2 cores", "cpu": "test CPU", "cases": cases,
            "gemm": {"shapes": shapes, "peak": {"float32": PEAK, "bfloat16": 2 * PEAK}}}


@pytest.fixture
def result():
    return fabricated()


def test_markdown_names_every_case_variant_and_shape(result):
    text = "\n".join(suite.markdown(result))
    for case in suite.CASES:
        assert f"## {suite.CASE_LABELS[case]}" in text
    for variant in suite.VARIANTS:
        assert text.count(f"| {suite.VARIANT_LABELS[variant]} |") >= 3  # a row in every case table
    assert "| ORTModule + AdamW | failed: RuntimeError: no kernel for op 'Foo' |" in text
    assert "| lm head | gpt2 | 1024 × 768 × 50257 | 100 | 200 | 2.00× |" in text
    # tiny's ORTModule row: 2.50× eager, 1.25× compile, first step 10%, MFU 50e9/0.4/100e9 = 125%.
    assert "| ORTModule + AdamW | 2.00 s | 400 ms | 2.50× | 1.25× | 10% | 125% | 900 MB | 4.0000 |" in text
    assert "4.5000 (≠ eager)" in text  # a loss off eager's by > 1% is flagged


def test_goals_judge_each_figure(result):
    met = {goal: (measured, ok) for goal, measured, _, ok in suite.goals(result)}
    assert met["tiny GPT: step vs eager"] == ("2.50× (FusedAdam 2.86×)", True)
    assert met["baby GPT: step vs eager"][1] is False  # 1.25× < 1.4×
    assert met["baby GPT: MFU (fp32 GEMM peak)"] == ("62%", False)
    assert met["BERT-mini classifier (HF): step vs eager"] == ("- (FusedAdam 2.86×)", None)
    assert met["GPT-2 small (124M): step vs torch.compile"] == ("1.25×", True)
    assert met["baby GPT: step vs torch.compile"] == ("0.62×", False)
    assert met["tiny GPT: first step ÷ torch.compile's"] == ("10%", True)
    text = "\n".join(suite.markdown(result))
    assert "| BERT-mini classifier (HF): first step ÷ torch.compile's | - | ≤ 25% | not measured |" in text


def test_markdown_warns_when_other_work_ran(result):
    result["cores"] = 2
    assert "Other work was running" not in "\n".join(suite.markdown(result))
    result["cases"]["tiny"]["variants"]["compile"]["load_before"] = 3.0
    lines = suite.markdown(result)
    assert lines[4].startswith("**Other work was running**: other processes kept 3.0 of 2 cores busy")
    assert lines[3] == lines[5] == "" and lines[6] == "## Goals"
    result["cases"]["tiny"]["variants"]["compile"]["load_before"] = 0.2
    result["gemm"]["load_before"] = 1.5  # the GEMM peak is skewed too
    assert "kept 1.5 of 2 cores busy" in "\n".join(suite.markdown(result))


def test_write_saves_json_markdown_and_png(result, tmp_path):
    suite.write(result, str(tmp_path))
    assert json.loads((tmp_path / "suite.json").read_text()) == result
    assert (tmp_path / "suite.md").read_text().startswith("# Training-step suite, 2026-11-23")
    png = (tmp_path / "suite.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def test_gemm_shapes_are_the_cases_layers():
    shapes = {(s["case"], s["label"]): (s["m"], s["k"], s["n"]) for s in suite.gemm_shapes(["baby", "bert"])}
    assert shapes[("", "large square")] == (4096, 4096, 4096)
    assert shapes[("baby", "qkv")] == (2048, 384, 1152)
    assert shapes[("baby", "mlp down")] == (2048, 1536, 384)
    assert shapes[("bert", "mlp up")] == (4096, 256, 1024)
    assert not any(case == "tiny" for case, _ in shapes)


def test_chart_survives_a_run_where_everything_failed(tmp_path):
    result = {"date": "2026-11-23", "machine": "m", "cpu": "c", "gemm": {"error": "killed"},
              "cases": {"tiny": {"steps": 3, "warmup": 1, "variants": {"eager": {"error": "killed"}}}}}
    lines = suite.write(result, str(tmp_path))
    assert "| eager + AdamW | failed: killed |" in "\n".join(lines)
    assert (tmp_path / "suite.png").read_bytes()[:4] == b"\x89PNG"


def test_model_flops_of_tiny_gpt():
    import model_zoo
    c = suite.CASES["tiny"]
    model = model_zoo.NanoGPT(vocab=c["vocab"], width=c["width"], heads=c["heads"], layers=c["layers"],
                              positions=c["context"])
    w, tokens = c["width"], c["batch"] * c["context"]
    matmul_weights = c["layers"] * 12 * w * w + c["vocab"] * w  # qkv 3w², proj w², MLP 8w²; tied head
    attention = 12 * c["layers"] * w * c["context"] * tokens
    assert suite.model_flops(model, c, ()) == 6 * matmul_weights * tokens + attention == 3_964_207_104
