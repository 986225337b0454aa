"""The plan cache: an ORTModule keeps at most ORTMODULE_MAX_CACHED_GRAPHS exports (one per input
schema, with their engines); a model whose schema changes every step stays within it, what is
dropped is really freed (engines, PythonOp registry entries), results stay equal to eager, and a
dropped schema seen again exports again."""
import copy
import gc
import logging
import weakref

import torch

from torch_ort import DebugOptions, LogLevel, ORTModule
from torch_ort.ortmodule.export import python_op
from torch_ort.ortmodule.policy.variables import Settings
from torch_ort.ortmodule.engine.plan_cache import PlanCache

from test_threads import Scale  # a PythonOp: x * s with its own backward

INFO = DebugOptions(log_level=LogLevel.INFO)
BOUND = 2


class Net(torch.nn.Module):
    """`k` (a Python int) is part of the input schema: every new value exports."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)
        self.offset = 0.0

    def forward(self, x, k: int):
        return Scale.apply(torch.tanh(self.fc(x)), 0.5) * k + self.offset


def engines_of(module) -> dict:
    """schema key -> weak references to that runner's engines."""
    return {key: [weakref.ref(e) for e in runner._engines.values()]
            for key, runner in module._plan_cache.items()}


def test_schema_changing_every_step_stays_within_the_bound(monkeypatch, strict, torch_ort_log):
    monkeypatch.setenv("ORTMODULE_MAX_CACHED_GRAPHS", str(BOUND))
    torch.manual_seed(0)
    eager = Net().eval()
    ours = ORTModule(copy.deepcopy(eager), INFO).eval()
    x = torch.randn(3, 6)
    engines, sites = {}, {}  # per k: weak references to its engines; its PythonOp registry ids
    steps = 4
    with torch.no_grad():
        for k in range(steps):
            before = set(python_op._SITES)
            torch.testing.assert_close(ours(x, k), eager(x, k), rtol=1e-5, atol=1e-6)
            sites[k] = set(python_op._SITES) - before
            assert sites[k], "the export registered its Function call"
            (key,) = [key for key in ours._plan_cache.keys() if ("int", repr(k)) in key[1][1]]
            engines[k] = engines_of(ours)[key]
            assert len(ours._plan_cache) <= BOUND
    assert ours.export_count == steps
    gc.collect()
    kept = range(steps - BOUND, steps)
    for k in range(steps):
        alive = [r() is not None for r in engines[k]]
        assert alive == [k in kept] * len(alive), f"k={k}: engines alive {alive}"
        registered = [python_op.registered(i) is not None for i in sites[k]]
        assert registered == [k in kept] * len(registered), f"k={k}: registry entries {registered}"
    evictions = [r for r in torch_ort_log if r.levelno == logging.INFO
                 and "ORTMODULE_MAX_CACHED_GRAPHS=2" in r.getMessage()]
    assert len(evictions) == steps - BOUND

    # A dropped schema seen again exports again, evicting the least recently used (k=3, since
    # the hit on k=2 made it recent).
    with torch.no_grad():
        ours(x, 2)
        assert ours.export_count == steps
        torch.testing.assert_close(ours(x, 0), eager(x, 0), rtol=1e-5, atol=1e-6)
        assert ours.export_count == steps + 1
        ours(x, 2)
        assert ours.export_count == steps + 1
        ours(x, 3)
    assert ours.export_count == steps + 2


def test_training_engines_are_freed_on_eviction(monkeypatch, strict):
    monkeypatch.setenv("ORTMODULE_MAX_CACHED_GRAPHS", "2")
    torch.manual_seed(0)
    eager = Net()
    ours = ORTModule(copy.deepcopy(eager))
    x = torch.randn(5, 6)
    refs = []
    for k in range(4):
        loss_e, loss_o = eager(x, k).square().sum(), ours(x, k).square().sum()
        loss_e.backward()
        loss_o.backward()
        refs.append([r for rs in engines_of(ours).values() for r in rs])
        for p, q in zip(eager.parameters(), ours.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)
        assert len(ours._plan_cache) <= 2
    del loss_o
    gc.collect()
    assert all(r() is None for r in refs[0] if r not in refs[-1])  # k=0's training engine
    assert refs[0] and refs[0][0]() is None and refs[-1][0]() is not None


def test_model_changes_keep_the_stale_entries_bounded(monkeypatch, strict):
    monkeypatch.setenv("ORTMODULE_MAX_CACHED_GRAPHS", "1")
    eager = Net().eval()
    ours = ORTModule(copy.deepcopy(eager)).eval()
    x = torch.randn(2, 6)
    with torch.no_grad():
        for k in range(3):
            eager.offset = ours.offset = float(k)  # read by forward: cached graphs become stale
            torch.testing.assert_close(ours(x, k), eager(x, k), rtol=1e-5, atol=1e-6)
            assert len(ours._plan_cache) + ours._plan_cache.num_candidates <= 1  # the bound covers both together


def test_bound_setting():
    assert Settings.from_env({}).max_cached_graphs == 16
    assert Settings.from_env({"ORTMODULE_MAX_CACHED_GRAPHS": "0"}).max_cached_graphs == 0  # no bound


class _Export:
    def __init__(self, graph: bytes):
        self.onnx_bytes, self.param_names = graph, ["w"]


class _Runner:
    """What PlanCache reads of a GraphRunner: its export, and adopt_engines."""

    def __init__(self, graph: bytes = b"g"):
        self.export, self.adopted = _Export(graph), None

    def adopt_engines(self, old):
        self.adopted = old


def _key(i: int):
    return (True, ("spec", (("int", repr(i)),)), ())


def test_plan_cache_keeps_the_most_recently_used_and_counts_candidates_in_the_bound():
    evicted = []
    cache = PlanCache(2, evicted.append)
    a, b, c = _Runner(), _Runner(), _Runner()
    cache.store(_key(1), a)
    cache.store(_key(2), b)
    assert cache.get(_key(1)) is a  # now the most recently used: b goes first
    cache.store(_key(3), c)
    assert evicted == [b] and cache.keys() == [_key(1), _key(3)]
    cache.model_changed(frozenset({"scale"}))  # both become re-export candidates
    assert len(cache) == 0 and cache.num_candidates == 2 and cache.get(_key(1)) is None
    same, other = _Runner(), _Runner(b"changed")
    cache.store(_key(1), same)  # the same graph: takes over the candidate's engines
    assert same.adopted is a and evicted == [b] and cache.num_candidates == 1
    cache.store(_key(4), _Runner())  # over the bound (2 runners + 1 candidate): the candidate goes
    assert evicted == [b, c] and cache.num_candidates == 0
    cache.discard(_key(4), cache.get(_key(4)))
    cache.store(_key(3), other)
    assert other.adopted is None and cache.num_candidates == 0 and len(cache) == 2
    cache.discard(_key(3), same)  # not the runner cached for that key: kept
    assert len(cache) == 2
    cache.discard(_key(3), other)
    assert cache.keys() == [_key(1)]
