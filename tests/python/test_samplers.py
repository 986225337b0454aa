"""torch_ort.utils.data's load-balancing samplers: coverage, balance against DistributedSampler,
determinism, drop_last/padding, equal batch counts, random_level, process-group defaults."""
import collections

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from torch_ort.utils.data import LoadBalancingDistributedBatchSampler, LoadBalancingDistributedSampler


class Lengths(torch.utils.data.Dataset):
    """Sample i is a sequence of lengths[i] tokens; its complexity is its length."""

    def __init__(self, lengths):
        self.lengths = [int(n) for n in lengths]

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return torch.zeros(self.lengths[i])


def skewed(n=1000, seed=0):
    """Long-tailed lengths like real text: most short, a few very long."""
    return Lengths(np.clip(np.random.default_rng(seed).lognormal(4.0, 1.0, n), 1, 4096))


def samplers(dataset, world_size, **kw):
    return [LoadBalancingDistributedSampler(dataset, len, world_size=world_size, rank=r, **kw)
            for r in range(world_size)]


def per_rank(samplers_):
    return [list(s) for s in samplers_]


@pytest.mark.parametrize("n,world_size", [(1000, 4), (1001, 4), (7, 3), (2, 5)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_index_on_exactly_one_rank_padding_aside(n, world_size, shuffle):
    ds = skewed(n)
    ranks = per_rank(samplers(ds, world_size, shuffle=shuffle))
    expected_len = -(-n // world_size)
    assert [len(r) for r in ranks] == [expected_len] * world_size
    counts = collections.Counter(i for r in ranks for i in r)
    assert set(counts) == set(range(n))  # nothing missing, nothing out of range
    assert sum(counts.values()) - n == expected_len * world_size - n  # only the padding repeats
    if n >= world_size:  # a repeat is padding for the last chunk: never twice on one rank
        for r in ranks:
            assert len(set(r)) == len(r)


@pytest.mark.parametrize("shuffle", [True, False])
def test_drop_last_drops_the_remainder_and_nothing_repeats(shuffle):
    ds = skewed(1003)
    ranks = per_rank(samplers(ds, 4, drop_last=True, shuffle=shuffle))
    assert [len(r) for r in ranks] == [250] * 4
    flat = [i for r in ranks for i in r]
    assert len(set(flat)) == 1000  # 3 dropped, no repeats
    if not shuffle:  # without shuffling, the most complex tail is what goes
        dropped = set(range(1003)) - set(flat)
        assert sorted(ds.lengths[i] for i in dropped) == sorted(ds.lengths)[-3:]


def test_shuffled_drop_last_drops_different_samples_each_epoch():
    ds = skewed(1003)
    s = LoadBalancingDistributedSampler(ds, len, world_size=4, rank=0, drop_last=True)
    dropped = []
    for epoch in range(3):
        s.set_epoch(epoch)
        kept = set(s.assignment().ravel().tolist())
        dropped.append(frozenset(set(range(1003)) - kept))
    assert len(set(dropped)) == 3


def balance(index_lists, lengths):
    """(max/min of the ranks' epoch sums, mean over steps of max/min of the ranks' samples)."""
    sums = [sum(lengths[i] for i in r) for r in index_lists]
    steps = [max(lengths[r[k]] for r in index_lists) / min(lengths[r[k]] for r in index_lists)
             for k in range(min(len(r) for r in index_lists))]
    return max(sums) / min(sums), float(np.mean(steps))


def test_balanced_against_distributed_sampler_on_a_skewed_dataset():
    ds, ws = skewed(1000), 4
    ours = per_rank(samplers(ds, ws))
    torch_ds = [list(DistributedSampler(ds, num_replicas=ws, rank=r, seed=0)) for r in range(ws)]
    ours_epoch, ours_step = balance(ours, ds.lengths)
    torch_epoch, torch_step = balance(torch_ds, ds.lengths)
    print(f"\nmax/min per-rank epoch sum: ours {ours_epoch:.3f}, DistributedSampler {torch_epoch:.3f}; "
          f"mean per-step max/min: ours {ours_step:.3f}, DistributedSampler {torch_step:.3f}")
    assert ours_epoch < 1.05 and ours_epoch < torch_epoch
    assert ours_step < 1.1 and torch_step > 3.0


def test_same_seed_and_epoch_same_order_other_epoch_other_order():
    ds = skewed(500)
    a = LoadBalancingDistributedSampler(ds, len, world_size=2, rank=1, seed=3)
    b = LoadBalancingDistributedSampler(ds, len, world_size=2, rank=1, seed=3)
    assert list(a) == list(b) and list(a) == list(a)
    a.set_epoch(1)
    assert list(a) != list(b)
    b.set_epoch(1)
    assert list(a) == list(b)
    c = LoadBalancingDistributedSampler(ds, len, world_size=2, rank=1, seed=4)
    c.set_epoch(1)
    assert list(c) != list(a)


def test_without_shuffle_epochs_repeat_and_order_is_ascending():
    ds = skewed(400)
    s = LoadBalancingDistributedSampler(ds, len, world_size=4, rank=2, shuffle=False)
    first = list(s)
    s.set_epoch(5)
    assert list(s) == first
    lengths = [ds.lengths[i] for i in first]
    assert lengths == sorted(lengths)


def test_complexity_fn_runs_once_per_sample():
    ds = skewed(50)
    calls = collections.Counter()

    def fn(sample):
        calls[len(sample)] += 1
        return len(sample)
    s = LoadBalancingDistributedSampler(ds, fn, world_size=2, rank=0)
    for epoch in range(3):
        s.set_epoch(epoch)
        list(s)
    assert sum(calls.values()) == 50


def test_group_size_sorts_within_groups_and_shuffles_groups():
    ds = skewed(120)
    s = LoadBalancingDistributedSampler(ds, len, world_size=2, rank=0, group_size=20, shuffle=False)
    table = s.assignment()
    for chunk_start in range(0, 60, 10):  # 20 samples per group = 10 chunks of 2
        group = table[chunk_start:chunk_start + 10].ravel()
        assert set(group.tolist()) == set(range(2 * chunk_start, 2 * chunk_start + 20))
    shuffled = LoadBalancingDistributedSampler(ds, len, world_size=2, rank=0, group_size=20)
    firsts = set()
    for epoch in range(6):
        shuffled.set_epoch(epoch)
        firsts.add(tuple(sorted(shuffled.assignment()[:10].ravel().tolist())))
    assert len(firsts) > 1  # the first group differs between epochs
    for group in firsts:  # but is always one whole group of the dataset
        assert group == tuple(range(group[0], group[0] + 20)) and group[0] % 20 == 0


def test_random_level_trades_balance_for_randomness():
    ds, ws = skewed(1000), 4
    steps = []
    for level in (0.0, 0.2, 1.0):
        ranks = per_rank(samplers(ds, ws, random_level=level))
        steps.append(balance(ranks, ds.lengths)[1])
    assert steps[0] < steps[1] < steps[2]
    s0 = LoadBalancingDistributedSampler(ds, len, world_size=ws, rank=0, random_level=0.5, shuffle=False)
    e0 = list(s0)
    s0.set_epoch(1)
    assert list(s0) != e0  # the noise is redrawn per epoch even without shuffling


def tokens_budget(ds, budget):
    def batch_fn(indices):
        batches, cur, used = [], [], 0
        for i in indices:
            if cur and used + ds.lengths[i] > budget:
                batches.append(cur)
                cur, used = [], 0
            cur.append(i)
            used += ds.lengths[i]
        return batches + ([cur] if cur else [])
    return batch_fn


@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_equal_batch_counts_across_ranks(drop_last):
    ds, ws = skewed(997), 3
    fn = tokens_budget(ds, 2000)
    bss = [LoadBalancingDistributedBatchSampler(s, fn, drop_last=drop_last) for s in samplers(ds, ws)]
    raw = [len(fn(list(s))) for s in samplers(ds, ws)]
    lens = [len(b) for b in bss]
    assert len(set(lens)) == 1 and lens[0] == (min(raw) if drop_last else max(raw))
    for bs in bss:
        batches = list(bs)
        assert len(batches) == lens[0]
        own = fn(list(bs.sampler))
        assert batches[:min(len(own), lens[0])] == own[:lens[0]]  # own batches first, then repeats
    bss[0].set_epoch(1)
    assert list(bss[0]) != list(LoadBalancingDistributedBatchSampler(samplers(ds, ws)[0], fn))


def test_batch_sampler_drives_a_dataloader():
    ds = skewed(64)
    s = LoadBalancingDistributedSampler(ds, len, world_size=2, rank=1)
    bs = LoadBalancingDistributedBatchSampler(s, lambda idx: [idx[k:k + 4] for k in range(0, len(idx), 4)])
    loader = DataLoader(ds, batch_sampler=bs, collate_fn=lambda xs: [len(x) for x in xs])
    seen = [n for batch in loader for n in batch]
    assert len(seen) == 32 and len(loader) == 8


def test_bad_arguments_are_named():
    ds = skewed(10)
    with pytest.raises(ValueError, match="rank"):
        LoadBalancingDistributedSampler(ds, len, world_size=2, rank=2)
    with pytest.raises(ValueError, match="random_level"):
        LoadBalancingDistributedSampler(ds, len, world_size=2, rank=0, random_level=1.5)
    with pytest.raises(ValueError, match="group_size"):
        LoadBalancingDistributedSampler(ds, len, world_size=2, rank=0, group_size=0)
    with pytest.raises(TypeError, match=r"complexity_fn\(dataset\[0\]\)"):
        list(LoadBalancingDistributedSampler(ds, lambda x: "long", world_size=2, rank=0))
    with pytest.raises(TypeError, match="finite"):
        list(LoadBalancingDistributedSampler(ds, lambda x: float("nan"), world_size=2, rank=0))
    dropping = LoadBalancingDistributedSampler(ds, len, world_size=2, rank=0, drop_last=True)
    with pytest.raises(ValueError, match="drop_last=False"):
        LoadBalancingDistributedBatchSampler(dropping, lambda idx: [idx])
    with pytest.raises(ValueError, match="LoadBalancingDistributedSampler"):
        LoadBalancingDistributedBatchSampler(DistributedSampler(ds, 2, 0), lambda idx: [idx])
    empty_for_rank_1 = LoadBalancingDistributedBatchSampler(
        LoadBalancingDistributedSampler(ds, len, world_size=2, rank=0),
        lambda idx: [idx] if 0 in idx else [])
    with pytest.raises(ValueError, match="no batch for rank"):
        list(empty_for_rank_1)


def test_world_from_the_process_group_or_a_clear_error(tmp_path):
    import torch.distributed as dist
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="no initialized process group"):
        LoadBalancingDistributedSampler(skewed(10), len)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        s = LoadBalancingDistributedSampler(skewed(10), len)
        assert (s.world_size, s.rank, len(s)) == (1, 0, 10)
        assert sorted(s) == list(range(10))
        explicit = LoadBalancingDistributedSampler(skewed(10), len, world_size=2, rank=1)
        assert (explicit.world_size, explicit.rank) == (2, 1)  # explicit values win
    finally:
        dist.destroy_process_group()
