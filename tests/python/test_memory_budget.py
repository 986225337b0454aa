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
