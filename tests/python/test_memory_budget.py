"""ORTMODULE_MEMORY_BUDGET: before the first training step the planner takes the cheapest plan
whose predicted step peak fits (smaller chunks of the fused LM head and loss, then recompute
levels), reports it, and refuses an impossible budget before anything runs, naming the smallest
budget that would fit; a chosen plan's measured peak stays under the budget and trains as eager."""
import copy
import re

import pytest
import torch

from torch_ort import ORTModule
from torch_ort.ortmodule import MemoryBudgetError
from torch_ort.ortmodule.policy.variables import Settings

from test_label_sparsity import llama, sft_batch


def plan_for(monkeypatch, budget, make=llama, steps=1):
    monkeypatch.setenv("ORTMODULE_MEMORY_BUDGET", budget)
    torch.manual_seed(0)
    model = ORTModule(make())
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids, labels = sft_batch(gen)
        model(input_ids=ids, labels=labels).loss.backward()
    return model


@pytest.mark.parametrize("text, expected", [("6GiB", 6 << 30), ("512 MiB", 512 << 20), ("1.5KiB", 1536),
                                            ("2GB", 2 * 10 ** 9), ("4096", 4096)])
def test_budget_sizes_parse(text, expected):
    assert Settings.from_env({"ORTMODULE_MEMORY_BUDGET": text}).memory_budget == expected


@pytest.mark.parametrize("text", ["lots", "-1GiB", "3 parsecs", "0"])
def test_a_malformed_budget_is_refused(text):
    with pytest.raises(ValueError, match="ORTMODULE_MEMORY_BUDGET"):
        Settings.from_env({"ORTMODULE_MEMORY_BUDGET": text})


def test_an_ample_budget_keeps_the_default_plan(monkeypatch):
    model = plan_for(monkeypatch, "64GiB")
    plan = model.stats()["memory_plan"]
    assert (plan.memory_opt_level, plan.loss_chunk_bytes) == (0, 0)
    assert 0 < plan.predicted <= plan.budget


def test_an_impossible_budget_is_refused_before_the_first_step(monkeypatch):
    torch.manual_seed(0)
    eager = llama()
    before = copy.deepcopy(eager.state_dict())
    monkeypatch.setenv("ORTMODULE_MEMORY_BUDGET", "1KiB")
    model = ORTModule(eager)
    ids, labels = sft_batch(torch.Generator().manual_seed(1))
    with pytest.raises(MemoryBudgetError, match=r"smallest predicted step peak is [\d.]+ (MiB|GiB) "
                                                r"\(recompute level \d, LM-head chunks [^)]+\): set a "
                                                r"budget of at least [\d.]+ (MiB|GiB)"):
        model(input_ids=ids, labels=labels)
    for name, value in eager.state_dict().items():  # nothing ran: the parameters are untouched
        assert torch.equal(value, before[name]), name


def test_a_tight_budget_takes_a_smaller_plan_that_fits(monkeypatch):
    """A budget just under the default plan's prediction: the planner picks a cheaper-memory plan;
    the step's measured peak stays under the budget, and training matches eager."""
    default = plan_for(monkeypatch, "64GiB").stats()["memory_plan"]
    budget = default.predicted - 1
    model = plan_for(monkeypatch, str(budget), steps=2)
    plan = model.stats()["memory_plan"]
    assert (plan.memory_opt_level, plan.loss_chunk_bytes) != (0, 0)
    assert plan.predicted <= budget
    measured = model.memory_report().measured
    assert measured is not None and 0 < measured["peak"] <= budget, measured
    # The refusal of a budget below every plan names that plan's prediction as the minimum.
    with pytest.raises(MemoryBudgetError) as err:
        plan_for(monkeypatch, "1KiB")
    smallest = re.search(r"at least ([\d.]+) (MiB|GiB)", str(err.value))
    assert float(smallest.group(1)) * (1 << (20 if smallest.group(2) == "MiB" else 30)) <= plan.predicted * 1.01


class FakeEngine:
    """An engine under a plan, as within_budget sees it: the memory report's predicted peak and the
    fused head's workspace (one chunk of logits, 256 MiB by default)."""

    def __init__(self, level, chunk, peak_of):
        self.level, self.chunk = level, chunk or (256 << 20)
        self.peak = peak_of(level)

    def memory_report(self, sizes):
        return {"predicted": {"peak": self.peak, "complete": True}}

    def stats(self):
        return {"kernel_workspace_bytes": self.chunk}


def choose(budget_mib, peak_of, level=0):
    from torch_ort.ortmodule.engine.memory_budget import within_budget
    built = []

    def compile_with(lvl, chunk):
        built.append((lvl, chunk >> 20))
        return FakeEngine(lvl, chunk, peak_of)

    settings = Settings.from_env({"ORTMODULE_MEMORY_BUDGET": f"{budget_mib}MiB",
                                  "ORTMODULE_MEMORY_OPT_LEVEL": str(level)})
    engine, plan = within_budget(FakeEngine(level, 0, peak_of), compile_with, [], [], settings)
    assert (engine.level, engine.chunk) == (plan.memory_opt_level, plan.loss_chunk_bytes or 256 << 20)
    return (plan.memory_opt_level, plan.loss_chunk_bytes >> 20), built


MIB = 1 << 20


def test_halved_chunks_come_before_recompute():
    # Recompute would fit with the default chunk, but a 128 MiB chunk fits without it.
    plan, built = choose(1000, lambda level: (872 if level == 0 else 500) * MIB)
    assert plan == (0, 128) and built == [(0, 128)]
    plan, _ = choose(1000, lambda level: (900 if level == 0 else 500) * MIB)
    assert plan == (0, 64)
    plan, _ = choose(1000, lambda level: (950 if level == 0 else 500) * MIB)
    assert plan == (1, 0)


def test_small_chunks_at_the_lowest_level_that_fits():
    # Recompute does not lower the peak (the head's gradients make it): 32 MiB chunks without it,
    # not with the highest level, and 8 MiB ones only where 32 MiB fits nowhere.
    plan, _ = choose(1000, lambda level: 960 * MIB)
    assert plan == (0, 32)
    plan, _ = choose(1000, lambda level: 990 * MIB)
    assert plan == (0, 8)
    plan, _ = choose(1000, lambda level: (980 if level < 2 else 960) * MIB)
    assert plan == (2, 32)


def test_a_configured_level_is_the_least_tried():
    plan, built = choose(1000, lambda level: 960 * MIB, level=1)
    assert plan == (1, 32) and all(lvl >= 1 for lvl, _ in built)
    with pytest.raises(MemoryBudgetError, match=r"peak is 962.0 MiB \(recompute level 1, LM-head chunks "
                                                r"2.0 MiB\): set a budget of at least 962.0 MiB"):
        choose(900, lambda level: 960 * MIB, level=1)
