"""Data-dependent Python decisions (export/decisions.py): a module that branches on a tensor's
value is exported with the decision taken from the call's values, checked in the graph on every
later call (DecisionCheck); a call that flips it runs on a graph for its own outcome, never on the
other branch's. Fallback is disabled (the suite's default): everything below runs in the engine."""
import copy

import pytest
import torch
import torch.nn.functional as F

from torch_ort import ORTModule


class LabelCheck(torch.nn.Module):
    """Wav2Vec2-CTC's guard: labels out of range raise before the loss."""

    def __init__(self, classes=8):
        super().__init__()
        self.classes = classes
        self.fc = torch.nn.Linear(4, classes)

    def forward(self, x, labels):
        if labels.max() >= self.classes:
            raise ValueError(f"labels must be below {self.classes}")
        return F.cross_entropy(self.fc(x), labels)


class Branches(torch.nn.Module):
    """Two different graphs, chosen by the sign of the input's sum."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.a(x).square().mean()
        return self.b(x).sigmoid().mean()


def assert_grads_close(ours, eager, rtol=1e-4, atol=1e-6):
    for (name, p), q in zip(eager.named_parameters(), ours.parameters()):
        if p.grad is None:
            assert q.grad is None, name
        else:
            torch.testing.assert_close(q.grad, p.grad, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def run_both(eager, ours, batches, lr=1e-2, loss_of=lambda out: out, loss_rtol=1e-5, grad_rtol=1e-4, grad_atol=1e-6):
    """AdamW steps of both on each batch (a tuple of arguments or a dict of keywords): the same
    loss and gradients at every step."""
    opts = [torch.optim.AdamW(m.parameters(), lr=lr) for m in (eager, ours)]
    for step, batch in enumerate(batches):
        losses = []
        for model, opt in zip((eager, ours), opts):
            opt.zero_grad()
            loss = loss_of(model(**batch) if isinstance(batch, dict) else model(*batch))
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=loss_rtol, atol=1e-6, msg=lambda m: f"step {step}: {m}")
        assert_grads_close(ours, eager, grad_rtol, grad_atol)
        for opt in opts:
            opt.step()


def test_a_check_on_the_labels_values_trains_in_the_engine():
    torch.manual_seed(0)
    eager = LabelCheck()
    ours = ORTModule(copy.deepcopy(eager))
    gen = torch.Generator().manual_seed(1)
    run_both(eager, ours, [(torch.randn(6, 4, generator=gen), torch.randint(0, 8, (6,), generator=gen))
                           for _ in range(4)])
    st = ours.stats()
    assert st["fallback"] is None and st["exports"] == 1
    assert st["op_counts"].get("com.torch_ort::DecisionCheck", 0) >= 1


def test_a_flipped_decision_never_gives_a_wrong_result():
    """Positive, negative, positive, ... sums: each call's loss and gradients are eager's. One
    export per outcome: flipping back runs the graph exported for that outcome again."""
    torch.manual_seed(0)
    eager = Branches()
    ours = ORTModule(copy.deepcopy(eager))
    gen = torch.Generator().manual_seed(2)
    signs = [1, -1, 1, 1, -1, 1]
    run_both(eager, ours, [(torch.rand(5, 4, generator=gen) * s,) for s in signs])
    st = ours.stats()
    assert st["exports"] == 2 and st["fallback"] is None
    assert st["decision_flips"] == 4 and st["decisions"] >= 1  # calls 2, 3, 5 and 6 flip it


def test_a_value_the_guard_refuses_raises_as_eager_does():
    model = ORTModule(LabelCheck())
    x = torch.randn(6, 4)
    model(x, torch.randint(0, 8, (6,))).backward()
    with pytest.raises(Exception, match="labels must be below 8"):
        model(x, torch.tensor([0, 1, 2, 3, 4, 9]))


class AccumulateThenBranch(torch.nn.Module):
    """The eager experts loop's pattern: rows accumulated in place with index_add_, then a decision
    on what was accumulated (torch computes index_add_ through a decomposition while exporting)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, index):
        total = torch.zeros(6, 4)
        total.index_add_(0, index, self.fc(x))
        if total.sum() > 10.0:
            return total.square().mean()
        return total.sigmoid().mean()


def test_a_decision_after_an_in_place_accumulation_is_taken_from_eager_values():
    """The accumulated sum is about 7 (a bias of 0.25 over 7 rows of 4): eager takes the second
    branch; counted twice it would be 14, past the threshold of 10. The export decides as eager
    does, and the engine's result is eager's on every call, without a flip."""
    torch.manual_seed(0)
    eager = AccumulateThenBranch()
    with torch.no_grad():
        eager.fc.weight.zero_()
        eager.fc.bias.fill_(0.25)
    ours = ORTModule(copy.deepcopy(eager))
    index = torch.tensor([0, 1, 2, 3, 4, 5, 0])
    batches = [(torch.randn(7, 4, generator=torch.Generator().manual_seed(i)), index) for i in range(3)]
    run_both(eager, ours, batches, lr=1e-3)
    st = ours.stats()
    assert st["fallback"] is None and st["exports"] == 1 and st["decision_flips"] == 0


def test_deberta_v2_sequence_classification_trains_in_the_engine():
    """`if label_index.size(0) > 0:` after a nonzero, in DeBERTa-v2's loss."""
    import transformers
    cfg = transformers.DebertaV2Config(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64, max_position_embeddings=64, num_labels=3,
                                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    eager = transformers.DebertaV2ForSequenceClassification(cfg)
    ours = ORTModule(copy.deepcopy(eager))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager, ours)]
    gen = torch.Generator().manual_seed(1)
    for step in range(3):
        batch = dict(input_ids=torch.randint(0, 100, (2, 8), generator=gen),
                     labels=torch.randint(0, 3, (2,), generator=gen))
        losses = []
        for model, opt in zip((eager, ours), opts):
            opt.zero_grad()
            loss = model(**batch).loss
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-6)
        for (name, p), q in zip(eager.named_parameters(), ours.parameters()):
            # The key bias's gradient is zero up to rounding (softmax ignores a per-row constant).
            tol = 1e-6 if name.endswith("key_proj.bias") else 1e-3 * p.grad.norm().item()
            assert (q.grad - p.grad).norm().item() <= tol + 1e-7, name
        for opt in opts:
            opt.step()
    assert ours.stats()["fallback"] is None
    assert ours.stats()["op_counts"].get("com.torch_ort::DecisionCheck", 0) >= 1


def _wav2vec2_ctc():
    import transformers
    cfg = transformers.Wav2Vec2Config(
        vocab_size=12, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        conv_dim=(16, 16), conv_stride=(4, 2), conv_kernel=(8, 4), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2, mask_time_prob=0.0, layerdrop=0.0, hidden_dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
        ctc_loss_reduction="mean", pad_token_id=0)
    return transformers.Wav2Vec2ForCTC(cfg)


def test_wav2vec2_ctc_trains_in_the_engine():
    """Wav2Vec2-CTC: `if labels.max() >= vocab_size` (a decision from values), the targets picked by
    masked_select (a data-dependent size) and CTC loss (output sized by the target lengths' values,
    run as torch_ort::ctc_loss). Audio and label lengths vary per call, label lengths per row;
    exported once."""
    torch.manual_seed(0)
    eager = _wav2vec2_ctc()
    ours = ORTModule(copy.deepcopy(eager))
    gen = torch.Generator().manual_seed(3)
    batches = []
    for samples, lengths in [(400, (5, 3)), (480, (4, 6)), (360, (2, 5))]:
        labels = torch.full((2, 6), -100, dtype=torch.long)
        for row, n in enumerate(lengths):
            labels[row, :n] = torch.randint(1, 12, (n,), generator=gen)
        batches.append(dict(input_values=torch.randn(2, samples, generator=gen), labels=labels))
    run_both(eager, ours, batches, lr=1e-3, loss_of=lambda out: out.loss, loss_rtol=1e-4, grad_rtol=1e-3,
             grad_atol=1e-5)
    st = ours.stats()
    assert st["fallback"] is None and st["exports"] == 1
    assert "torch_ort::ctc_loss.default" in st["aten_fallback_ops"]
