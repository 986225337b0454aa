"""The pool of large CPU buffers (csrc/runtime/buffer_pool.h, ORTMODULE_CPU_BUFFER_POOL): the fused
LM head's chunk of logits and its weight's gradient, and an embedding's dense gradient, are kept for
the next step instead of being mapped afresh. Training with the pool gives the same bits as without
it and as eager's embedding gradient; a gradient the user keeps, accumulates into or holds after the
module is gone stays intact; idle buffers are given back after a step that does not use them; the
variable turns the pool off."""
import copy
import gc

import pytest
import torch
import torch.nn.functional as F

from torch_ort import ORTModule, _C

VOCAB, HIDDEN = 40000, 256  # the head's weight and gradient: 41 MB


class LM(torch.nn.Module):
    """An embedding, a Linear with tanh and an untied LM head; returns the loss only."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, HIDDEN)
        self.mid = torch.nn.Linear(HIDDEN, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids, labels):
        logits = self.head(torch.tanh(self.mid(self.emb(ids))))
        return F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), ignore_index=-100)


def batches(n, batch=4, seq=64):
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (batch, seq), generator=gen)
        labels = ids.clone()
        labels[:, : seq // 3] = -100
        out.append((ids, labels))
    return out


def train(model, data, zero=True):
    """Losses and the gradients of each step (copies), AdamW."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, grads = [], []
    for ids, labels in data:
        if zero:
            opt.zero_grad(set_to_none=True)
        loss = model(ids, labels)
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return losses, grads


@pytest.fixture
def pool_setting():
    yield
    _C.set_cpu_buffer_pool(True)  # the default, for the tests after this one


def with_and_without_pool(monkeypatch, base):
    """(setting, ORTModule of a copy of `base`) with ORTMODULE_CPU_BUFFER_POOL=1, then =0."""
    for on in ("1", "0"):
        monkeypatch.setenv("ORTMODULE_CPU_BUFFER_POOL", on)
        yield on, ORTModule(copy.deepcopy(base))


def test_training_with_the_pool_is_bitwise_training_without_it(monkeypatch, pool_setting):
    torch.manual_seed(0)
    data = batches(4)
    runs = {}
    for on, model in with_and_without_pool(monkeypatch, LM()):
        reused = _C.cpu_buffer_pool()["reused"]
        runs[on] = train(model, data)
        pool = model.stats()["cpu_buffer_pool"]
        assert model.stats()["fallback"] is None
        if on == "1":  # every step after the first takes the head's and the embedding's dW again
            assert pool["enabled"] and pool["reused"] - reused >= 2 * (len(data) - 1)
        else:
            assert not pool["enabled"] and pool["reused"] == reused and pool["idle_bytes"] == 0
    (loss_on, grads_on), (loss_off, grads_off) = runs["1"], runs["0"]
    for step, (a, b) in enumerate(zip(loss_on, loss_off)):
        assert torch.equal(a, b), f"step {step}: loss {a} with the pool, {b} without"
    for step, (ga, gb) in enumerate(zip(grads_on, grads_off)):
        for name in ga:
            assert torch.equal(ga[name], gb[name]), f"step {step}: {name}.grad differs"


class Lookup(torch.nn.Module):
    """An embedding whose output gradient is a fixed tensor (the weights of a weighted sum), the same
    bits in eager and in the engine: only the scatter-add of its rows can differ."""

    def __init__(self, rows):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, HIDDEN)
        self.register_buffer("coef", torch.randn(rows, HIDDEN))

    def forward(self, ids):
        return (self.emb(ids) * self.coef).sum()


def test_pooled_embedding_gradient_is_eagers_bit_for_bit():
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (4096,))
    ids[:512] = 7  # repeated tokens: rows that add up
    ids[512:600] = 123
    eager = Lookup(ids.numel())
    ours = ORTModule(copy.deepcopy(eager))
    reused = _C.cpu_buffer_pool()["reused"]
    for step in range(2):  # the second step's gradient comes from the pool
        for m in (eager, ours):
            m.zero_grad(set_to_none=True)
            m(ids).backward()
        assert ours.stats()["fallback"] is None
        assert torch.equal(ours.module.emb.weight.grad, eager.emb.weight.grad), f"step {step}"
    assert _C.cpu_buffer_pool()["reused"] > reused


def test_gradients_accumulated_across_steps_are_eagers():
    """Without zero_grad the new gradient (a pooled buffer) is added into .grad and released; the
    sums must be eager's."""
    torch.manual_seed(0)
    eager = LM()
    ours = ORTModule(copy.deepcopy(eager))
    data = batches(3)
    _, g_e = train(eager, data, zero=False)
    _, g_o = train(ours, data, zero=False)
    for step, (a, b) in enumerate(zip(g_o, g_e)):
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6,
                                       msg=lambda m: f"step {step}, {name}.grad: {m}")


def test_a_gradient_kept_by_the_user_outlives_the_module_and_later_steps():
    torch.manual_seed(0)
    model = ORTModule(LM())
    data = batches(3)
    model(*data[0]).backward()
    kept = model.module.head.weight.grad  # the user keeps the pooled buffer itself
    copy_of_kept = kept.clone()
    model.module.zero_grad(set_to_none=True)
    for ids, labels in data[1:]:  # later steps must not be handed the kept buffer
        model(ids, labels).backward()
        assert model.module.head.weight.grad.data_ptr() != kept.data_ptr()
        model.module.zero_grad(set_to_none=True)
    del model
    gc.collect()
    assert torch.equal(kept, copy_of_kept)
    del kept  # its buffer goes back to the pool, or to the system: either way no crash
    gc.collect()


def test_idle_buffers_go_back_after_a_step_that_does_not_use_them():
    torch.manual_seed(0)
    model = ORTModule(LM())
    for ids, labels in batches(2):
        model.module.zero_grad(set_to_none=True)
        model(ids, labels).backward()
    model.module.zero_grad(set_to_none=True)  # the gradients go idle
    idle = _C.cpu_buffer_pool()["idle_bytes"]
    assert idle >= 2 * VOCAB * HIDDEN * 4  # the head's and the embedding's dW at least
    small = ORTModule(torch.nn.Linear(4, 4))
    x = torch.randn(2, 4)
    small(x)  # one forward: what was idle before it may still serve the step after it
    small(x)  # a second: nothing took them through a whole step, so they are given back
    assert _C.cpu_buffer_pool()["idle_bytes"] == 0


def profiled_peak(model, ids, labels):
    """The peak of the running sum of torch.profiler's CPU allocation records over one forward and
    backward (what benchmarks/memory_measure.py's allocator figure is)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model(ids, labels).backward()
    records, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            records.append((node.start_time_ns, node.extra_fields.alloc_size))
    running = peak = 0
    for _, size in sorted(records):
        running += size
        peak = max(peak, running)
    return peak


def test_the_profiler_sees_pooled_buffers_as_allocations(monkeypatch, pool_setting):
    torch.manual_seed(0)
    data = batches(3)
    peaks = {}
    for on, model in with_and_without_pool(monkeypatch, LM()):
        for ids, labels in data[:2]:
            model.module.zero_grad(set_to_none=True)
            model(ids, labels).backward()
        model.module.zero_grad(set_to_none=True)
        reused = _C.cpu_buffer_pool()["reused"]
        peaks[on] = profiled_peak(model, *data[2])
        assert (_C.cpu_buffer_pool()["reused"] > reused) == (on == "1")
    assert peaks["0"] >= 2 * VOCAB * HIDDEN * 4  # the two vocabulary-sized gradients at least
    assert abs(peaks["1"] - peaks["0"]) <= 0.01 * peaks["0"], peaks


def test_a_chunk_whose_size_follows_the_counted_labels_is_reused():
    """Label sparsity gives the LM head as many rows as labels count, a different number every
    batch: the buffer of a larger chunk serves a smaller one."""
    torch.manual_seed(0)
    model = ORTModule(LM())
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, VOCAB, (8, 64), generator=gen)
    labels = [ids.clone(), ids.clone()]
    labels[0][:, :16] = -100  # 384 rows counted: a 61 MB chunk of logits
    labels[1][:, :21] = -100  # 344 rows: 55 MB
    model(ids, labels[0]).backward()
    for step in range(4):
        model.module.zero_grad(set_to_none=True)
        reused = _C.cpu_buffer_pool()["reused"]
        model(ids, labels[(step + 1) % 2]).backward()
        # the chunk, the head's dW and the embedding's dW all come from the pool
        assert _C.cpu_buffer_pool()["reused"] - reused == 3, f"step {step + 1}"
    assert model.stats()["label_density"] in (384 / 512, 344 / 512)


class SmallVocabLM(torch.nn.Module):
    """The head of a small-vocabulary model (8,192 x 256, as the mixture-of-experts benchmark's):
    its dW is 8 MiB and its chunk of logits 8 MiB, under the 32 MiB above which glibc always maps
    afresh, yet paying their page faults every step all the same."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(8192, 256)
        self.head = torch.nn.Linear(256, 8192, bias=False)

    def forward(self, ids):
        logits = self.head(self.emb(ids))
        return F.cross_entropy(logits.view(-1, 8192), ids.view(-1))


def test_buffers_of_a_few_mib_are_pooled_too():
    torch.manual_seed(0)
    eager = SmallVocabLM()
    model = ORTModule(copy.deepcopy(eager))
    ids = torch.randint(0, 8192, (4, 64), generator=torch.Generator().manual_seed(3))
    for step in range(3):
        model.module.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        reused = _C.cpu_buffer_pool()["reused"]
        loss = model(ids)
        loss.backward()
        eager(ids).backward()
        assert model.stats()["fallback"] is None
        if step > 0:  # the head's dW and the embedding's gradient (8 MiB each) come from the pool
            assert _C.cpu_buffer_pool()["reused"] - reused >= 2, f"step {step}"
        for p, e in zip(model.module.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, e.grad, rtol=1e-4, atol=1e-6)


class LogitsLM(LM):
    """LM returning its logits beside the loss, as a Hugging Face causal LM does: the product
    (256 x 40,000 floats, 41 MB) is at the size glibc maps afresh on every allocation."""

    def forward(self, ids, labels):
        logits = self.head(torch.tanh(self.mid(self.emb(ids))))
        return F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), ignore_index=-100), logits


def test_returned_logits_come_from_the_pool_and_stay_the_users(monkeypatch, pool_setting):
    torch.manual_seed(0)
    base = LogitsLM()
    data = batches(4)
    runs = {}
    for on, model in with_and_without_pool(monkeypatch, base):
        kept, copies, losses = [], [], []
        for step, (ids, labels) in enumerate(data):
            model.module.zero_grad(set_to_none=True)
            loss, logits = model(ids, labels)
            loss.backward()
            losses.append(loss.detach())
            if step == 0:  # the user keeps the first step's logits: no later step may write them
                kept, copies = logits, logits.clone()
            else:
                ptr = logits.data_ptr()
                del logits  # released: the next step's product may take its buffer
                assert ptr != kept.data_ptr()
            assert model.stats()["fallback"] is None
        assert torch.equal(kept, copies)
        with torch.no_grad():
            eager = base(*data[0])[1]
        torch.testing.assert_close(kept, eager, rtol=1e-5, atol=1e-5)
        runs[on] = (kept, losses)
    assert torch.equal(runs["1"][0], runs["0"][0])
    for step, (a, b) in enumerate(zip(runs["1"][1], runs["0"][1])):
        assert torch.equal(a, b), f"step {step}: loss {a} with the pool, {b} without"


def test_a_product_of_mapped_size_goes_back_to_the_pool_and_serves_the_next_step():
    torch.manual_seed(0)
    model = ORTModule(LogitsLM())
    ids, labels = batches(1)[0]
    ptrs = []
    for step in range(3):
        model.module.zero_grad(set_to_none=True)
        loss, logits = model(ids, labels)
        loss.backward()
        ptrs.append(logits.data_ptr())
        idle = _C.cpu_buffer_pool()["idle_bytes"]
        nbytes = logits.numel() * logits.element_size()
        del logits  # the user lets go of it: its buffer is idle in the pool, not unmapped
        assert _C.cpu_buffer_pool()["idle_bytes"] - idle == nbytes, f"step {step}"
    assert ptrs[1] == ptrs[2], "the second step's product did not take the first's buffer"
