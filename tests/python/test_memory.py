"""The planner's saved set and lifetimes, the static peak estimate against the bytes a run
holds, the recompute levels and plans (gradients equal to level 0's), the report and its errors."""
import logging

import onnx
import pytest
import torch
import torch.nn as nn

import model_zoo
from torch_ort import ORTModule


def gpt(layers: int = 2, dropout: float = 0.0):
    torch.manual_seed(0)
    return model_zoo.NanoGPT(layers=layers, dropout=dropout)


def batch(b: int = 2, t: int = 16, seed: int = 1):
    data = torch.randint(0, model_zoo.VOCAB, (b, t + 1), generator=torch.Generator().manual_seed(seed))
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def training_engine(model: ORTModule):
    engines = [e for r in model._plan_cache.runners() for (training, _), e in r._engines.items() if training]
    assert len(engines) == 1, engines
    return engines[0]


def train(model, steps: int = 3, b: int = 2, t: int = 16):
    """Losses and final parameters of `steps` SGD steps (a fixed batch per step)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        _, loss = model(*batch(b, t, seed=step))
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


# --- the saved set and lifetimes -------------------------------------------------------------------
def test_saved_set_is_exactly_what_backward_reads(strict):
    model = ORTModule(gpt())
    model(*batch())[1].backward()
    engine = training_engine(model)
    stats = engine.stats()
    g = onnx.load_from_string(engine.training_graph_onnx()).graph
    # The exported training graph: inputs = forward inputs + output gradients, outputs = forward
    # outputs + input gradients; nodes = forward nodes, then backward nodes.
    forward, backward = g.node[:stats["num_forward_nodes"]], g.node[stats["num_forward_nodes"]:]
    available = {i.name for i in g.input[:len(engine.input_names)]} | {o for n in forward for o in n.output}
    returned_grads = {o.name for o in g.output[len(engine.output_names):]}
    read_by_backward = {i for n in backward for i in n.input if i} | returned_grads
    expected = (available - {i.name for i in g.initializer}) & read_by_backward
    assert len(backward) > 0 and len(expected) > 10
    assert set(stats["saved_names"]) == expected


class Deep(nn.Module):
    def __init__(self, layers: int, width: int = 256):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh())
                                      for _ in range(layers)])

    def forward(self, x):
        return self.layers(x)


def measured_forward_peak(layers: int) -> int:
    torch.manual_seed(0)
    model = ORTModule(Deep(layers))
    x = torch.randn(64, 256)
    with torch.no_grad():
        model(x)  # builds the inference engine
    engine = next(e for r in model._plan_cache.runners() for e in r._engines.values())
    engine.set_memory_tracking(True)
    with torch.no_grad():
        model(x)
    return engine.measured_memory()["forward_peak"]


def test_buffers_are_freed_at_last_use(strict):
    """Inference through 2 and 16 layers holds the same live bytes at its peak (each layer's
    buffer dies once the next layer read it), though 16 layers produce 8x the values."""
    shallow, deep = measured_forward_peak(2), measured_forward_peak(16)
    one = 64 * 256 * 4
    assert one <= shallow <= 3 * one, shallow
    assert deep == shallow, (shallow, deep)


@pytest.mark.parametrize("release", ["0", "0.000001"])  # gradients handed over at the end, or in groups
def test_prediction_matches_the_bytes_a_step_holds(strict, monkeypatch, release):
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", release)
    model = ORTModule(gpt())
    idx, tgt = batch(4, 32)
    predicted = model.memory_report(idx, tgt).predicted  # before any step
    model(idx, tgt)[1].backward()
    report = model.memory_report(idx, tgt)
    measured = report.measured
    assert measured is not None and measured["peak"] > 0
    for key in ("forward_peak", "saved", "backward_peak", "peak"):
        assert predicted[key] == report.predicted[key]
        assert abs(predicted[key] - measured[key]) <= 0.05 * measured[key], (key, predicted, measured)
    assert predicted["complete"]


def test_prediction_follows_the_batch(strict):
    """The estimate is a formula in the input dims: evaluated for another batch before it runs."""
    model = ORTModule(gpt())
    small = model.memory_report(*batch(2, 16)).predicted
    big = model.memory_report(*batch(8, 16)).predicted
    assert model.export_count == 1
    assert 3.0 < big["saved"] / small["saved"] <= 4.0
    model(*batch(8, 16))[1].backward()
    measured = model.memory_report(*batch(8, 16)).measured
    assert abs(big["peak"] - measured["peak"]) <= 0.05 * measured["peak"]


# --- recompute ---------------------------------------------------------------------------------------
def run_level(monkeypatch, level: int, config: str = "", dropout: float = 0.0):
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_LEVEL", str(level))
    if config:
        monkeypatch.setenv("ORTMODULE_MEMORY_OPT_CONFIG", config)
    else:
        monkeypatch.delenv("ORTMODULE_MEMORY_OPT_CONFIG", raising=False)
    model = ORTModule(gpt(dropout=dropout))
    torch.manual_seed(123)  # dropout draws the same stream at every level
    losses, params = train(model)
    return model, losses, params


@pytest.mark.parametrize("level", [1, 2])
def test_recompute_levels_keep_gradients_bit_identical(monkeypatch, strict, level):
    base, losses0, params0 = run_level(monkeypatch, 0)
    model, losses, params = run_level(monkeypatch, level)
    assert training_engine(model).stats()["recompute_nodes"] > 0
    assert training_engine(base).stats()["recompute_nodes"] == 0
    for a, b in zip(losses0, losses):
        assert torch.equal(a, b)
    for name in params0:
        assert torch.equal(params0[name], params[name]), name
    saved0 = base.memory_report().predicted["saved"]
    report = model.memory_report()
    assert report.predicted["saved"] < 0.6 * saved0, (report.predicted["saved"], saved0)
    # outside the layers: the loss's log-probabilities, rebuilt from the logits the caller holds
    assert any("SoftmaxCrossEntropyLoss+" in r.cluster and r.enabled for r in report.rows)


def test_recompute_with_dropout_keeps_gradients_bit_identical(monkeypatch, strict):
    _, losses0, params0 = run_level(monkeypatch, 0, dropout=0.1)
    _, losses, params = run_level(monkeypatch, 1, dropout=0.1)
    assert all(torch.equal(a, b) for a, b in zip(losses0, losses))
    assert all(torch.equal(params0[n], params[n]) for n in params0)


def test_config_plans_by_cluster_and_count(monkeypatch, strict):
    base, losses0, params0 = run_level(monkeypatch, 0)
    rows = base.memory_report().rows
    assert rows and all(r.enabled == 0 for r in rows)
    row = next(r for r in rows if r.strategy == 1 and r.occurrences >= 2)
    model, losses, params = run_level(monkeypatch, 0, f"{row.cluster}:1:1")
    after = {(r.cluster, r.strategy): r for r in model.memory_report().rows}
    assert after[(row.cluster, 1)].enabled == 1
    assert sum(r.enabled for r in after.values()) == 1
    assert all(torch.equal(a, b) for a, b in zip(losses0, losses))
    assert all(torch.equal(params0[n], params[n]) for n in params0)
    # strategy 0 turns a cluster off even at level 1
    model, _, _ = run_level(monkeypatch, 1, f"{row.cluster}:0:-1")
    assert {(r.cluster, r.strategy): r for r in model.memory_report().rows}[(row.cluster, 1)].enabled == 0


def test_unknown_cluster_lists_the_valid_ones(monkeypatch, strict):
    base, _, _ = run_level(monkeypatch, 0)
    valid = base.memory_report().rows[0].cluster
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_CONFIG", "NoSuchOp+:1:-1")
    model = ORTModule(gpt())
    with pytest.raises(ValueError, match="NoSuchOp") as info:
        model(*batch())
    assert "valid cluster ids" in str(info.value) and valid in str(info.value)


@pytest.mark.parametrize("text", ["Gelu+", "Gelu+:3:1", "Gelu+:1:-2", "Gelu+:1:x", ":1:1"])
def test_malformed_config_is_refused(monkeypatch, text):
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_CONFIG", text)
    with pytest.raises(ValueError, match="ORTMODULE_MEMORY_OPT_CONFIG"):
        ORTModule(gpt())


# --- the report -------------------------------------------------------------------------------------
def test_report_is_logged_before_the_first_step_and_measured_after(monkeypatch, strict, torch_ort_log):
    monkeypatch.setenv("ORTMODULE_LOG_LEVEL", "INFO")
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_LEVEL", "1")
    model = ORTModule(gpt())
    model(*batch())[1].backward()
    text = [r.getMessage() for r in torch_ort_log if r.levelno == logging.INFO]
    report = next(i for i, m in enumerate(text) if m.startswith("Memory report"))
    measured = next(i for i, m in enumerate(text) if "first step measured peak" in m)
    assert report < measured
    table = text[report]
    for row in model.memory_report().rows:
        assert row.cluster in table
    assert "ORTMODULE_MEMORY_OPT_LEVEL=1" in table and "step peak" in table
    torch_ort_log.clear()
    model(*batch())[1].backward()  # later steps log nothing and are not measured
    assert not [r for r in torch_ort_log if "Memory report" in r.getMessage()]


def test_report_without_a_call_needs_inputs():
    with pytest.raises(ValueError, match="pass example inputs"):
        ORTModule(gpt()).memory_report()


def test_print_memory_stats_shows_the_engine_peak(monkeypatch, strict, torch_ort_log):
    monkeypatch.setenv("ORTMODULE_PRINT_MEMORY_STATS", "1")
    model = ORTModule(gpt())
    for _ in range(2):
        model(*batch())[1].backward()
    post = [r.getMessage() for r in torch_ort_log if "post-backward" in r.getMessage()]
    assert len(post) == 2 and all("engine backward peak" in m and "step peak" in m for m in post)
