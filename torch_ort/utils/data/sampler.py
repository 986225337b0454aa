"""Load-balancing distributed samplers: every rank gets samples of similar complexity at every
step, so no rank waits on a straggler holding the longest sequences.

Order of work per epoch, ONNX Runtime's (same seed, epoch, world size and rank: the same indices
in the same order, so a run moves between the two mid-epoch; docs/migration.md), every rank
computing it alone: complexities (once) -> noise -> sort, whole dataset or within groups -> with
group_size, shuffle the groups -> cut into chunks of world_size neighbours, padding by wrapping
round to the order's start (or dropping the tail) -> without group_size, shuffle the chunks ->
rank r takes element r of each chunk. The random draws all come from one CPU torch.Generator
seeded with seed + epoch, in that order: noise (only when random_level makes any), then the group
or the chunk permutation."""
from __future__ import annotations

import math
import numbers
from typing import Callable, Iterator, Optional

import numpy as np
import torch
from torch.utils.data import Sampler


def _world(world_size: Optional[int], rank: Optional[int]) -> tuple[int, int]:
    """Explicit values win; otherwise the initialized default process group's."""
    if world_size is None or rank is None:
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("LoadBalancingDistributedSampler: world_size and rank were not given "
                               "and torch.distributed has no initialized process group; pass both "
                               "(e.g. world_size=1, rank=0) or call init_process_group first")
        world_size = dist.get_world_size() if world_size is None else world_size
        rank = dist.get_rank() if rank is None else rank
    if not isinstance(world_size, numbers.Integral) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if not isinstance(rank, numbers.Integral) or not 0 <= rank < world_size:
        raise ValueError(f"Invalid rank {rank!r}: rank should be in the interval [0, {world_size - 1}]")
    return int(world_size), int(rank)


def _as_number(value, index: int) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"complexity_fn(dataset[{index}]) returned {value!r}; it must return a "
                        "finite number (e.g. the sample's sequence length)")
    return float(value)


class LoadBalancingDistributedSampler(Sampler[int]):
    """Like torch.utils.data.DistributedSampler, each rank iterates over its own ``len(self)``
    indices of ``dataset``, but the ranks' samples at each position have similar
    ``complexity_fn(sample)`` (e.g. sequence length), so a step costs the same on every rank.

    ``group_size``: sort only within consecutive groups of that many samples (and, with shuffle,
    shuffle the groups) instead of across the whole dataset. ``random_level`` in [0, 1]: integer
    noise of up to (max - min complexity) * random_level is added before sorting, trading balance
    for randomness (0: best balance). ``drop_last``: leave out the last ``len(dataset) %
    world_size`` samples of the sorted order instead of padding with samples from its start.
    Call ``set_epoch(e)`` before each epoch to reshuffle. The order is ONNX Runtime's (module
    docstring), so it may be iterated any number of times (ORT's raises on a second pass)."""

    def __init__(self, dataset, complexity_fn: Callable[..., float], world_size: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = True, group_size: Optional[int] = None,
                 seed: int = 0, drop_last: bool = False, random_level: float = 0) -> None:
        self.world_size, self.rank = _world(world_size, rank)
        if not callable(complexity_fn):
            raise TypeError(f"complexity_fn must be callable, got {type(complexity_fn).__name__}")
        if group_size is not None and (not isinstance(group_size, numbers.Integral) or group_size < 1):
            raise ValueError(f"group_size must be None or a positive integer, got {group_size!r}")
        if not isinstance(random_level, numbers.Real) or not 0.0 <= random_level <= 1.0:
            raise ValueError(f"Invalid random_level {random_level!r}: it should be in [0.0, 1.0]")
        self.dataset = dataset
        self.complexity_fn = complexity_fn
        self.shuffle = bool(shuffle)
        self.group_size = None if group_size is None else int(group_size)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.random_level = float(random_level)
        self.epoch = 0
        n = len(dataset)
        self.num_samples = n // self.world_size if self.drop_last else math.ceil(n / self.world_size)
        self.total_size = self.num_samples * self.world_size
        self._complexities: Optional[np.ndarray] = None

    def complexities(self) -> np.ndarray:
        """complexity_fn of every sample, computed once (it may load the sample)."""
        if self._complexities is None:
            self._complexities = np.array(
                [_as_number(self.complexity_fn(self.dataset[i]), i) for i in range(len(self.dataset))],
                dtype=np.float64)
        return self._complexities

    def set_epoch(self, epoch: int) -> None:
        """A different order per epoch when shuffling or with random_level > 0 (same on all ranks).
        As in ORT the generator's seed is seed + epoch, so (seed 1, epoch 0) orders as (0, 1)."""
        self.epoch = int(epoch)

    def _generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed + self.epoch)

    def _keys(self, generator: torch.Generator) -> np.ndarray:
        """Complexities plus ORT's noise: integers drawn uniformly from
        [0, int((max - min) * random_level + 1)), none when that bound is 1. Whole-number
        complexities sort as int64, as ORT sorts them (a float array may order ties otherwise)."""
        keys = self.complexities()
        if len(keys) and np.all(np.abs(keys) < 2.0 ** 53) and np.array_equal(keys, np.round(keys)):
            keys = keys.astype(np.int64)
        if not len(keys):
            return keys
        bound = int((keys.max() - keys.min()) * self.random_level + 1)
        if bound > 1:
            keys = keys + torch.randint(bound, (len(keys),), generator=generator).numpy()
        return keys

    def _sorted(self, generator: torch.Generator) -> np.ndarray:
        """Dataset indices with similar complexities next to each other: sorted within each group
        (the whole dataset when group_size is None) by numpy's default argsort, as in ORT, so
        equal complexities come in the order it leaves them; groups shuffled when shuffle and
        group_size are set."""
        keys = self._keys(generator)
        n = len(keys)
        size = self.group_size or max(n, 1)
        groups = [start + np.argsort(keys[start:start + size]) for start in range(0, n, size)]
        if self.shuffle and self.group_size is not None:
            groups = [groups[i] for i in torch.randperm(len(groups), generator=generator).tolist()]
        return np.concatenate(groups) if groups else np.zeros(0, dtype=np.int64)

    def assignment(self) -> np.ndarray:
        """(len(self), world_size) dataset indices for this epoch: row i is every rank's i-th
        sample (one chunk of neighbours in the sorted order), column r is rank r's samples in
        iteration order."""
        generator = self._generator()
        order = self._sorted(generator)
        n, ws = len(order), self.world_size
        if not n:
            return np.zeros((0, ws), dtype=np.int64)
        rows = max(1, self.num_samples)
        # Padding wraps round to the order's start; drop_last leaves out the tail (ORT's choices).
        chunks = order[np.arange(rows * ws) % n].reshape(rows, ws)
        if self.shuffle and self.group_size is None:
            chunks = chunks[torch.randperm(rows, generator=generator).numpy()]
        return chunks[:self.num_samples]

    def __iter__(self) -> Iterator[int]:
        return iter(self.assignment()[:, self.rank].tolist())

    def __len__(self) -> int:
        return self.num_samples


class LoadBalancingDistributedBatchSampler(Sampler[list]):
    """Batches of a LoadBalancingDistributedSampler's indices: ``batch_fn(indices)`` turns one
    rank's indices (in order) into that rank's list of batches (lists of indices), e.g. batches
    under a token budget. Every rank yields the same number of batches (so no rank waits for a
    collective the others never call): the most any rank has, repeating a rank's own batches from
    its start, or with ``drop_last`` the fewest. ``set_epoch(e)`` reshuffles."""

    def __init__(self, sampler: LoadBalancingDistributedSampler, batch_fn: Callable[[list], list],
                 drop_last: bool = False) -> None:
        if not isinstance(sampler, LoadBalancingDistributedSampler):
            raise ValueError("sampler should be a LoadBalancingDistributedSampler, got "
                             f"{type(sampler).__name__}")
        if sampler.drop_last:
            raise ValueError("the wrapped LoadBalancingDistributedSampler must have drop_last=False "
                             "(this batch sampler equalises the batch counts itself)")
        if not callable(batch_fn):
            raise TypeError(f"batch_fn must be callable, got {type(batch_fn).__name__}")
        self.sampler, self.batch_fn, self.drop_last = sampler, batch_fn, bool(drop_last)
        self.world_size, self.rank = sampler.world_size, sampler.rank
        self._cache: Optional[tuple[int, list]] = None  # (epoch, every rank's batches)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def _batches_of(self, rank: int, indices: list) -> list:
        batches = [list(b) for b in self.batch_fn(indices)]
        for b in batches:
            if not b or not all(isinstance(i, numbers.Integral) for i in b):
                raise ValueError(f"batch_fn returned {b!r} for rank {rank}: every batch must be a "
                                 "non-empty list of dataset indices")
        return batches

    def all_batches(self) -> list:
        """Every rank's batches for this epoch, counts equalised."""
        if self._cache is None or self._cache[0] != self.sampler.epoch:
            table = self.sampler.assignment()
            per_rank = [self._batches_of(r, table[:, r].tolist()) for r in range(self.world_size)]
            counts = [len(b) for b in per_rank]
            target = min(counts) if self.drop_last else max(counts)
            if target and not all(counts):
                raise ValueError(f"batch_fn made no batch for rank {counts.index(0)} (batch counts "
                                 f"{counts}), so it cannot repeat one to match the others")
            padded = [(b * math.ceil(target / len(b)))[:target] if b else [] for b in per_rank]
            self._cache = (self.sampler.epoch, padded)
        return self._cache[1]

    def __iter__(self) -> Iterator[list]:
        return iter(self.all_batches()[self.rank])

    def __len__(self) -> int:
        return len(self.all_batches()[self.rank])
