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


def test_drop_last_leaves_out_the_tail_of_the_sorted_order():
    """ONNX Runtime's choice: the samples left out are the last of the sorted order. Sorted whole,
    that is the same most complex ones every epoch; with group_size, the tail of whichever group
    the shuffle puts last, so it changes with the epoch."""
    ds = skewed(1003)

    def dropped_per_epoch(group_size):
        s = LoadBalancingDistributedSampler(ds, len, world_size=4, rank=0, drop_last=True,
                                            group_size=group_size)
        dropped = []
        for epoch in range(3):
            s.set_epoch(epoch)
            dropped.append(frozenset(set(range(1003)) - set(s.assignment().ravel().tolist())))
        return dropped
    whole = dropped_per_epoch(None)
    assert len(set(whole)) == 1
    assert sorted(ds.lengths[i] for i in whole[0]) == sorted(ds.lengths)[-3:]
    assert len(set(dropped_per_epoch(100))) == 3


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
    # A step costs its slowest rank: that is what the sampler evens out. Over an epoch, rank r
    # takes element r of every sorted chunk (ONNX Runtime's dealing), so higher ranks sum a
    # little more.
    assert ours_step < 1.1 and torch_step > 3.0
    assert ours_epoch < 1.1 and ours_epoch < torch_epoch


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


# --- ONNX Runtime's order --------------------------------------------------------------------
# A run moves between the two samplers mid-epoch only if, for the same seed, epoch, world size
# and rank, they yield the same indices in the same order. The reference below is written from
# the algorithm's description, step by step, with plain lists.

def onnx_runtime_order(lengths, world_size, rank, seed=0, epoch=0, shuffle=True, group_size=None,
                       random_level=0.0, drop_last=False):
    """ONNX Runtime's LoadBalancingDistributedSampler: one CPU torch.Generator seeded with
    seed + epoch; integer noise below int(spread * random_level + 1) drawn first (only when that
    bound exceeds 1); numpy's default argsort within each group (group_size, else the whole
    dataset); with group_size and shuffle a permutation of the groups, drawn next; chunks of
    world_size consecutive indices, wrapping round to the start to pad (drop_last: the first
    len // world_size chunks only); without group_size, with shuffle, a permutation of the chunks,
    drawn last; rank r takes element r of each chunk in that order."""
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    keys = [int(c) for c in lengths]
    n = len(keys)
    bound = int((max(keys) - min(keys)) * random_level + 1)
    if bound > 1:
        keys = [k + e for k, e in zip(keys, torch.randint(bound, (n,), generator=generator).tolist())]
    size = n if group_size is None else group_size
    groups = []
    for begin in range(0, n, size):
        members = list(range(begin, min(begin + size, n)))
        rank_in_group = np.argsort(np.array([keys[i] for i in members], dtype=np.int64))
        groups.append([members[j] for j in rank_in_group])
    if shuffle and group_size is not None:
        groups = [groups[g] for g in torch.randperm(len(groups), generator=generator).tolist()]
    order = [i for group in groups for i in group]
    per_rank = n // world_size if drop_last else -(-n // world_size)
    chunks = [[order[(c * world_size + k) % n] for k in range(world_size)]
              for c in range(max(1, per_rank))]
    visit = list(range(len(chunks)))
    if shuffle and group_size is None:
        visit = torch.randperm(len(chunks), generator=generator).tolist()
    return [chunks[c][rank] for c in visit[:per_rank]]


ORT_CASES = [  # (n, world_size, group_size, seed, epoch, random_level, drop_last, shuffle)
    (120, 2, 20, 0, 0, 0.0, False, True),
    (1003, 4, 64, 7, 3, 0.0, False, True),
    (1003, 4, 64, 7, 3, 0.0, True, True),
    (1000, 8, 100, 1, 2, 0.3, False, True),   # noise drawn before the group permutation
    (997, 3, 1000, 5, 0, 0.0, False, True),   # one group larger than the dataset
    (1001, 4, None, 2, 4, 0.0, False, True),  # no groups: the chunks are shuffled instead
    (1001, 4, None, 2, 4, 0.5, True, True),
    (500, 4, 50, 3, 1, 0.2, False, False),
    (2, 5, 1, 0, 0, 0.0, False, True),        # fewer samples than ranks
]


@pytest.mark.parametrize("case", ORT_CASES, ids=str)
def test_every_rank_yields_onnx_runtimes_order(case):
    n, ws, group_size, seed, epoch, level, drop_last, shuffle = case
    ds = skewed(n, seed=n)
    for rank in range(ws):
        s = LoadBalancingDistributedSampler(ds, len, world_size=ws, rank=rank, shuffle=shuffle,
                                            group_size=group_size, seed=seed, drop_last=drop_last,
                                            random_level=level)
        s.set_epoch(epoch)
        expected = onnx_runtime_order(ds.lengths, ws, rank, seed, epoch, shuffle, group_size, level,
                                      drop_last)
        assert list(s) == expected, f"rank {rank}"
        assert list(s) == expected, f"rank {rank}, second pass"  # ORT's own raises here


@pytest.mark.parametrize("seed,epoch,level", [(0, 0, 0.0), (3, 2, 0.0), (3, 2, 0.4)])
def test_group_order_is_the_permutation_onnx_runtime_draws(seed, epoch, level):
    """Directly: the groups come in torch.randperm's order from a generator seeded with
    seed + epoch, after the noise draw when there is noise. Distinct complexities, one rank: the
    group of each run of group_size indices is that of its first."""
    n, group_size = 96, 8
    ds = Lengths(np.random.default_rng(1).permutation(np.arange(10, 10 + n)))
    s = LoadBalancingDistributedSampler(ds, len, world_size=1, rank=0, group_size=group_size,
                                        seed=seed, random_level=level)
    s.set_epoch(epoch)
    order = list(s)
    groups = [order[k] // group_size for k in range(0, n, group_size)]
    generator = torch.Generator().manual_seed(seed + epoch)
    if level:
        torch.randint(int((n - 1) * level + 1), (n,), generator=generator)
    assert groups == torch.randperm(n // group_size, generator=generator).tolist()
    for k in range(0, n, group_size):  # each group whole and sorted (noise aside)
        assert sorted(order[k:k + group_size]) == list(range(groups[k // group_size] * group_size,
                                                             (groups[k // group_size] + 1) * group_size))
        if not level:
            assert [ds.lengths[i] for i in order[k:k + group_size]] == \
                sorted(ds.lengths[i] for i in order[k:k + group_size])
