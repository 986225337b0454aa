"""A small transformer-style LM (padded Embedding, LayerNorm, GELU MLP, Dropout, label-smoothed
cross-entropy with ignore_index) trained through ORTModule next to eager PyTorch, dropout on: the
same seeds give the same masks, so losses and gradients agree step after step."""
import pytest
import torch
import torch.nn.functional as F

from conftest import twin
from torch_ort import ORTModule

VOCAB, PAD = 23, 0


class TinyLM(torch.nn.Module):
    def __init__(self, d=16, approximate="tanh"):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, d, padding_idx=PAD)
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d, bias=False)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.act = torch.nn.GELU(approximate=approximate)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(d, VOCAB)

    def forward(self, ids, targets):
        # Tokens flattened to (B·T, d): Linear exports as Gemm. (3-D activations export as
        # MatMul on untyped intermediates, which waits for shape inference of the IR.)
        x = self.drop(self.emb(ids.reshape(-1)))
        x = x + self.drop(self.fc2(self.act(self.fc1(self.ln1(x)))))
        logits = self.head(self.ln2(x))
        loss = F.cross_entropy(logits, targets.reshape(-1), ignore_index=-1, label_smoothing=0.1)
        return loss, logits


def batch(gen, b, t):
    ids = torch.randint(1, VOCAB, (b, t), generator=gen)
    ids[:, -2:] = PAD  # padded tail: its embedding row must get no gradient
    targets = torch.roll(ids, -1, 1)
    targets[ids == PAD] = -1  # and its positions no loss
    return ids, targets


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_tiny_lm_trains_like_eager_with_dropout(strict, approximate):
    eager, wrapped = twin(TinyLM, approximate=approximate)
    ours = ORTModule(wrapped)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=3e-3)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    losses_e, losses_o = [], []
    for step in range(8):
        ids, targets = batch(gen, 3 + step % 2, 7 + step % 3)  # new shapes must not re-export
        for model, losses, opt in ((eager, losses_e, opt_e), (ours, losses_o, opt_o)):
            torch.manual_seed(1000 + step)
            loss, _ = model(ids, targets)
            loss.backward()
            losses.append(loss.item())
            opt.step()
            opt.zero_grad(set_to_none=True)
    torch.testing.assert_close(torch.tensor(losses_o), torch.tensor(losses_e), rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(eager.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    assert ours.export_count == 1


def test_tiny_lm_first_gradients(strict):
    eager, wrapped = twin(TinyLM)
    ours = ORTModule(wrapped)
    ids, targets = batch(torch.Generator().manual_seed(1), 4, 9)
    for model in (eager, ours):
        torch.manual_seed(7)
        model(ids, targets)[0].backward()
    for (name, p), q in zip(eager.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    assert not ours.module.emb.weight.grad[PAD].any()
