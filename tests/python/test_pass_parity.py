"""The model parity suite with each graph pass disabled in turn (ORTMODULE_DISABLED_PASSES),
and with every pass on. A pass whose rewrite hides a bug elsewhere, or a fused kernel that drifts
from the unfused graph it replaces, shows up as a parity failure in one of these rows.

Each row trains eager and ORTModule side by side for a few AdamW steps (test_models.run_parity:
per-step losses rtol 1e-4, gradients rtol 1e-3 at the first and last step) on the four zoo models,
with dropout on for the models that have it so the dropout fusions are exercised too. The rows of
one model share an ORTMODULE_CACHE_DIR, so the model is exported once and every row after the first
builds its engine (where the passes run) from the cached graph."""
import pytest

import torch_ort
from test_models import run_parity

PASSES = torch_ort.pass_names()
MODELS = ("nanogpt", "gpt2", "bert_cls", "bert_mlm")
STEPS = 3


@pytest.fixture(autouse=True)
def every_pass(monkeypatch):
    """padding_elimination is off unless asked for: asked for here, so "every pass" is every pass."""
    monkeypatch.setenv("ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER", "1")


@pytest.fixture(scope="module")
def cache_dirs(tmp_path_factory):
    return {name: str(tmp_path_factory.mktemp(f"export_cache_{name}")) for name in MODELS}


@pytest.mark.parametrize("disabled", PASSES)
@pytest.mark.parametrize("name", MODELS)
def test_parity_with_one_pass_disabled(strict, monkeypatch, cache_dirs, name, disabled):
    monkeypatch.setenv("ORTMODULE_CACHE_DIR", cache_dirs[name])
    monkeypatch.setenv("ORTMODULE_DISABLED_PASSES", disabled)
    _, ours, _, _ = run_parity(name, dropout=0.1, steps=STEPS)
    (runner,) = ours._plan_cache.runners()
    assert runner._disabled_passes() == [disabled]
    for engine in runner._engines.values():
        changed = {c.removeprefix("training:") for c in engine.stats()["passes_changed"]}
        assert disabled not in changed


@pytest.mark.parametrize("name", MODELS)
def test_parity_with_every_pass_on(strict, monkeypatch, cache_dirs, name):
    monkeypatch.setenv("ORTMODULE_CACHE_DIR", cache_dirs[name])
    _, ours, _, _ = run_parity(name, dropout=0.1, steps=STEPS)
    (runner,) = ours._plan_cache.runners()
    assert runner._disabled_passes() == []
