"""Inputs and outputs as Hugging Face passes them: keyword arguments, labels computing the loss
inside, attention masks, ModelOutput rebuilt with its type and keys, None entries, integer
outputs (non-differentiable), tied weights (one parameter, one summed gradient)."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from transformers.modeling_outputs import SequenceClassifierOutput

from conftest import twin
from torch_ort import ORTModule
from torch_ort.ortmodule import ORTModuleIOError


class PooledClassifier(torch.nn.Module):
    """HF-style forward: keyword arguments, optional attention_mask and labels, a ModelOutput."""

    def __init__(self, width=8, classes=3):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, classes)

    def forward(self, inputs_embeds=None, attention_mask=None, labels=None, return_dict=True):
        x = inputs_embeds                                                 # (B, T, C)
        if attention_mask is None:
            pooled = x.mean(dim=1)
        else:
            m = attention_mask.to(x.dtype).unsqueeze(-1)                  # (B, T, 1)
            pooled = (x * m).sum(dim=1) / m.sum(dim=1)                    # padding left out
        logits = self.head(torch.tanh(self.fc(pooled)))                   # (B, classes)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        if not return_dict:
            return (loss, logits) if loss is not None else (logits,)
        return SequenceClassifierOutput(loss=loss, logits=logits)


def batch(n, t, gen, width=8):
    x = torch.randn(n, t, width, generator=gen)
    mask = torch.ones(n, t, dtype=torch.long)
    mask[0, t // 2:] = 0  # one padded row
    return x, mask, torch.randint(0, 3, (n,), generator=gen)


def test_keywords_labels_mask_and_model_output(strict):
    eager, wrapped = twin(PooledClassifier)
    ours = ORTModule(wrapped)
    gen = torch.Generator().manual_seed(0)
    for step, (n, t) in enumerate([(4, 6), (3, 9), (5, 2)]):
        x, mask, labels = batch(n, t, gen)
        # The keyword order differs from the signature and between steps: not part of the schema.
        kw = {"labels": labels, "attention_mask": mask, "inputs_embeds": x}
        if step % 2:
            kw = dict(reversed(list(kw.items())))
        out_o, out_e = ours(**kw), eager(**kw)
        assert type(out_o) is SequenceClassifierOutput and list(out_o.keys()) == list(out_e.keys())
        torch.testing.assert_close(out_o.loss, out_e.loss)
        torch.testing.assert_close(out_o["logits"], out_e.logits)  # dict-style access too
        torch.testing.assert_close(out_o[1], out_e[1])              # and tuple-style
        out_o.loss.backward()
        out_e.loss.backward()
    for (name, p), q in zip(eager.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert ours.export_count == 1

    # No labels: the loss is None, so the ModelOutput has no 'loss' key, exactly as in eager.
    with torch.no_grad():
        out_o, out_e = ours(inputs_embeds=x, attention_mask=mask), eager(inputs_embeds=x, attention_mask=mask)
    assert list(out_o.keys()) == list(out_e.keys()) == ["logits"] and out_o.loss is None
    torch.testing.assert_close(out_o.logits, out_e.logits)
    # return_dict=False: a plain tuple.
    out = ours(inputs_embeds=x, labels=labels, return_dict=False)
    assert type(out) is tuple and len(out) == 2


class MixedOutputs(torch.nn.Module):
    """Returns None entries, an int64 prediction, a bool mask and a nested dict."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x, labels):
        logits = self.fc(x)
        loss = F.cross_entropy(logits, labels)
        above = logits > 0                                   # bool, non-differentiable
        count = above.to(torch.int64).sum(dim=-1)            # int64, non-differentiable
        return loss, None, count, {"above": above, "logits": logits, "aux": None}


def test_none_entries_and_integer_outputs(strict):
    eager, wrapped = twin(MixedOutputs)
    ours = ORTModule(wrapped)
    gen = torch.Generator().manual_seed(1)
    x, labels = torch.randn(5, 6, generator=gen), torch.randint(0, 4, (5,), generator=gen)
    out_o, out_e = ours(x, labels), eager(x, labels)
    loss, none, count, extra = out_o
    assert none is None and extra["aux"] is None and set(extra) == {"above", "logits", "aux"}
    assert count.dtype == torch.int64 and not count.requires_grad
    assert extra["above"].dtype == torch.bool and not extra["above"].requires_grad
    assert loss.requires_grad and extra["logits"].requires_grad
    torch.testing.assert_close(count, out_e[2])
    torch.testing.assert_close(extra["above"], out_e[3]["above"])
    # Gradients arrive for some float outputs and not for others (None -> zeros).
    (loss + extra["logits"].square().mean()).backward()
    (out_e[0] + out_e[3]["logits"].square().mean()).backward()
    for p, q in zip(eager.parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)


class TiedProjection(torch.nn.Module):
    """Two layers, one weight (as GPT-2's lm_head and wte): used twice, one summed gradient."""

    def __init__(self, width=8):
        super().__init__()
        self.encode = torch.nn.Linear(width, width, bias=False)
        self.decode = torch.nn.Linear(width, width, bias=False)
        self.decode.weight = self.encode.weight

    def forward(self, x, target):
        return F.mse_loss(self.decode(torch.tanh(self.encode(x))), target)


def test_tied_weights_get_one_summed_gradient(strict):
    eager, wrapped = twin(TiedProjection)
    assert wrapped.decode.weight is wrapped.encode.weight  # deepcopy keeps the tie
    ours = ORTModule(wrapped)
    assert [n for n, _ in ours.named_parameters()] == ["encode.weight"]
    assert len(list(ours.named_parameters(remove_duplicate=False))) == 2
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_o = torch.optim.SGD(ours.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        x, target = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)
        for model, opt in ((eager, opt_e), (ours, opt_o)):
            opt.zero_grad()
            model(x, target).backward()
        torch.testing.assert_close(ours.encode.weight.grad, eager.encode.weight.grad, rtol=1e-4, atol=1e-6)
        opt_e.step()
        opt_o.step()
    # One graph input is bound to the shared parameter, and it is still shared after training.
    runner = next(iter(ours._plan_cache.runners()))
    assert len(runner.params) == 1 and runner.params[0] is ours.decode.weight
    assert ours.decode.weight is ours.encode.weight
    torch.testing.assert_close(ours.encode.weight, eager.encode.weight)


def test_input_returned_unchanged(strict):
    class PassThrough(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 1)

        def forward(self, x, labels):
            return self.fc(x).pow(2).mean(), labels

    ours = ORTModule(PassThrough())
    labels = torch.arange(4)
    loss, back = ours(torch.randn(4, 3), labels)
    assert torch.equal(back, labels) and back.dtype == torch.int64
    loss.backward()
    assert ours.fc.weight.grad is not None


@pytest.mark.parametrize("order", ["kw", "positional"])
def test_positional_and_keyword_calls_agree(strict, order):
    eager, wrapped = twin(PooledClassifier)
    ours = ORTModule(wrapped)
    x, mask, labels = batch(3, 5, torch.Generator().manual_seed(3))
    out = ours(x, mask, labels) if order == "positional" else ours(inputs_embeds=x, attention_mask=mask, labels=labels)
    torch.testing.assert_close(out.loss, eager(x, mask, labels).loss)


class LossKwargs(torch.nn.Module):
    """Trainer's convention: forward(**kwargs) collects extras such as num_items_in_batch."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, x, labels=None, **kwargs):
        loss = F.cross_entropy(self.fc(x), labels, reduction="sum")
        return loss / kwargs["num_items_in_batch"] if "num_items_in_batch" in kwargs else loss


def test_extra_keywords_collected_by_var_keyword(strict):
    """Keywords that land in forward's **kwargs export too (torch 2.11's export counted them
    twice against the dynamic shapes) and keep their symbolic dims."""
    eager, wrapped = twin(LossKwargs)
    ours = ORTModule(wrapped)
    gen = torch.Generator().manual_seed(5)
    for n in (4, 7):
        x, labels = torch.randn(n, 6, generator=gen), torch.randint(0, 3, (n,), generator=gen)
        count = torch.tensor(float(n))
        out_o, out_e = ours(x, labels=labels, num_items_in_batch=count), eager(x, labels=labels, num_items_in_batch=count)
        torch.testing.assert_close(out_o, out_e)
        out_o.backward()
        out_e.backward()
    torch.testing.assert_close(ours.fc.weight.grad, eager.fc.weight.grad)
    assert ours.export_count == 1
    assert "forward" not in wrapped.__dict__  # the export's signature is not left behind


def test_an_input_that_already_has_a_grad_trains_like_eager(strict):
    """An input reused across steps (input-gradient or adversarial training) carries a .grad when
    it reaches the export; its gradients accumulate as in eager."""
    eager, ours = twin(PooledClassifier)
    ours = ORTModule(ours)
    x_e = torch.randn(4, 5, 8, requires_grad=True)  # (B, T, C)
    torch.sin(x_e).sum().backward()  # x_e.grad is set before any ORTModule call
    x_o = x_e.detach().clone().requires_grad_(True)
    x_o.grad = x_e.grad.clone()
    for _ in range(2):
        for model, x in ((eager, x_e), (ours, x_o)):
            model(x).logits.square().sum().backward()
    torch.testing.assert_close(x_o.grad, x_e.grad, rtol=1e-5, atol=1e-6)
    for p, q in zip(eager.parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)


class DictBatch(torch.nn.Module):
    """forward takes one dict of tensors, passed positionally: model(batch)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, batch, scale=1.0):
        return (self.fc(batch["x"]) * batch["y"]).sum() * scale


@pytest.mark.parametrize("call", ["positional", "keyword", "with_default_given"])
def test_a_dict_argument_trains_like_eager(strict, call):
    """torch.onnx.export reads a trailing dict in args as keyword arguments; ours is bound by name."""
    eager, ours = twin(DictBatch)
    ours = ORTModule(ours)
    for step in range(3):
        gen = torch.Generator().manual_seed(step)
        batch = {"x": torch.randn(4, 3, generator=gen), "y": torch.randn(4, 2, generator=gen)}
        for model in (eager, ours):
            args, kwargs = {"positional": ((batch,), {}), "keyword": ((), {"batch": batch}),
                            "with_default_given": ((batch, 2.0), {})}[call]
            model.zero_grad()
            loss = model(*args, **kwargs)
            loss.backward()
            if model is eager:
                want = loss
        torch.testing.assert_close(loss, want)
        for p, q in zip(eager.parameters(), ours.parameters()):
            torch.testing.assert_close(q.grad, p.grad)


@dataclasses.dataclass
class Scored:
    """A plain dataclass of tensors, registered with nothing."""
    score: torch.Tensor
    hidden: torch.Tensor
    note: torch.Tensor | None = None


class ReturnsDataclass(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        return Scored(score=h.sum(), hidden=h)


def test_dataclass_output_comes_back_as_eager_returns_it(strict):
    eager, wrapped = twin(ReturnsDataclass)
    ours = ORTModule(wrapped)
    x = torch.randn(5, 4)
    out_o, out_e = ours(x), eager(x)
    assert type(out_o) is Scored and out_o.note is None
    torch.testing.assert_close(out_o.hidden, out_e.hidden)
    out_o.score.backward()
    out_e.score.backward()
    for p, q in zip(eager.parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad)
    ours(torch.randn(7, 4))
    assert ours.export_count == 1


class Opaque:
    def __init__(self, t):
        self.t = t


class ReturnsOpaque(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return Opaque(self.fc(x))


def test_unknown_output_object_is_named(strict):
    with pytest.raises(ORTModuleIOError, match="returns a test_model_io.Opaque, which is neither a tensor"):
        ORTModule(ReturnsOpaque())(torch.randn(2, 4))
