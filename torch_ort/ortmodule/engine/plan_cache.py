"""The plan cache of one ORTModule: its exported graphs (a GraphRunner each, holding the export
and its engines), one per key (training mode, input schema, autocast state), least recently used
first, at most ORTMODULE_MAX_CACHED_GRAPHS of them; and the re-export candidates a model change
leaves (an attribute set on the module), compared with their schema's next export so that an
unchanged graph keeps its engines."""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Callable, Iterator

LOGGER = logging.getLogger("torch_ort")


def describe(schema: tuple, limit: int = 160) -> str:
    """An input schema (call_schema.input_schema) in one short line, for the log."""
    leaves = ", ".join(f"{x[1]}[rank {x[2]}]".replace("torch.", "") if x[0] == "T" else x[1]
                       for x in schema[1])
    return leaves if len(leaves) <= limit else leaves[:limit - 3] + "..."


class PlanCache:
    """Runners by key, least recently used first. `limit` bounds the runners and the re-export
    candidates together (0: no bound); `on_evict(runner)` is told about each dropped runner."""

    def __init__(self, limit: int, on_evict: Callable[[Any], None] = lambda runner: None):
        self._limit = limit
        self._on_evict = on_evict
        self._runners: OrderedDict = OrderedDict()
        self._stale: OrderedDict = OrderedDict()  # key -> (runner, attributes set)

    def __len__(self) -> int:
        return len(self._runners)

    def items(self) -> list:
        """(key, runner) of every cached runner, least recently used first."""
        return list(self._runners.items())

    def keys(self) -> list:
        return list(self._runners)

    @property
    def num_candidates(self) -> int:
        """Re-export candidates a model change left, not yet re-exported or dropped."""
        return len(self._stale)

    def runners(self) -> Iterator[Any]:
        """The cached runners, least recently used first (re-export candidates not included)."""
        return iter(list(self._runners.values()))

    def get(self, key):
        """The runner for `key`, marked most recently used; None when there is none."""
        runner = self._runners.get(key)
        if runner is not None:
            self._runners.move_to_end(key)
        return runner

    def store(self, key, runner) -> None:
        """Caches a new runner for `key`. When a model change left a candidate for the same key,
        the runner takes over its engines if the graph and the parameter binding came out the
        same. Then the least recently used entries beyond the bound are dropped."""
        old, names = self._stale.pop(key, (None, ()))
        if old is not None:
            if old.export.onnx_bytes == runner.export.onnx_bytes and \
                    old.export.param_names == runner.export.param_names:
                runner.adopt_engines(old)
                LOGGER.info("re-export after setting %s: same schema and graph; engines kept",
                            ", ".join(sorted(names)))
            else:
                LOGGER.info("re-export after setting %s: the graph changed", ", ".join(sorted(names)))
        self._runners[key] = runner
        self._trim()

    def discard(self, key, runner) -> None:
        """Forgets `runner` if it is still the one cached for `key` (a failed re-export)."""
        if self._runners.get(key) is runner:
            del self._runners[key]

    def model_changed(self, names: frozenset) -> None:
        """Attributes `names` were set: every runner becomes a re-export candidate."""
        self._stale.update({key: (runner, names) for key, runner in self._runners.items()})
        self._runners = OrderedDict()
        self._trim()

    def _trim(self) -> None:
        """Drops the least recently used entries while runners and candidates together exceed the
        bound, candidates first (losing one costs an engine build, not an export). Nothing else
        holds a dropped runner, so its export, engines and PythonOp registry entries are freed
        (outputs still awaiting backward keep their engine until then)."""
        while self._limit and len(self._runners) + len(self._stale) > self._limit:
            cache, what = (self._stale, "re-export candidate") if self._stale else (self._runners, "graph")
            (training, schema, _), entry = cache.popitem(last=False)
            self._on_evict(entry[0] if isinstance(entry, tuple) else entry)
            LOGGER.info("plan cache: more than ORTMODULE_MAX_CACHED_GRAPHS=%d input schemas; dropped "
                        "the least recently used %s (%s mode, inputs %s); seen again, it re-exports",
                        self._limit, what, "training" if training else "eval", describe(schema))
