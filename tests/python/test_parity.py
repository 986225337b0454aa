"""Parity: ORTModule trains an MLP classifier and a regressor exactly like eager PyTorch."""
import pytest
import torch

from conftest import MLPClassifier, Regressor, classifier_batch, regression_batch, twin
from torch_ort import ORTModule

CASES = {
    "classifier": (MLPClassifier, classifier_batch),
    "regressor": (Regressor, regression_batch),
}
OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01),
}


def assert_grads_close(eager, ours, rtol=1e-4, atol=1e-6):
    for (name, p), (name2, q) in zip(eager.named_parameters(), ours.named_parameters()):
        assert name == name2
        assert q.grad is not None, f"{name}: no gradient through ORTModule"
        torch.testing.assert_close(q.grad, p.grad, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def run_steps(model, opt, batches, micro=1):
    losses = []
    for i, batch in enumerate(batches):
        loss, _ = model(*batch)
        (loss / micro).backward()
        losses.append(loss.item())
        if (i + 1) % micro == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return losses


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("varying_batch", [False, True], ids=["fixed_batch", "varying_batch"])
def test_training_parity(strict, case, opt_name, varying_batch):
    model_cls, make_batch = CASES[case]
    eager, wrapped = twin(model_cls)
    ours = ORTModule(wrapped)
    gen = torch.Generator().manual_seed(1)
    sizes = [8 + (3 * i) % 11 if varying_batch else 16 for i in range(30)]
    batches = [make_batch(n, gen=gen) for n in sizes]

    # Gradients after the first backward.
    for m in (eager, ours):
        loss, _ = m(*batches[0])
        loss.backward()
    assert_grads_close(eager, ours)
    for m in (eager, ours):
        m.zero_grad(set_to_none=True)

    opt_e, opt_o = OPTIMIZERS[opt_name](eager.parameters()), OPTIMIZERS[opt_name](ours.parameters())
    losses_e = run_steps(eager, opt_e, batches)
    losses_o = run_steps(ours, opt_o, batches)
    torch.testing.assert_close(torch.tensor(losses_o), torch.tensor(losses_e), rtol=1e-5, atol=1e-7)
    assert ours.export_count == 1, "a new batch size must not re-export"


@pytest.mark.parametrize("case", CASES)
def test_gradient_accumulation(strict, case):
    model_cls, make_batch = CASES[case]
    eager, wrapped = twin(model_cls)
    ours = ORTModule(wrapped)
    gen = torch.Generator().manual_seed(2)
    batches = [make_batch(6 + i % 3, gen=gen) for i in range(12)]
    opt_e, opt_o = OPTIMIZERS["adamw"](eager.parameters()), OPTIMIZERS["adamw"](ours.parameters())
    losses_e = run_steps(eager, opt_e, batches, micro=3)
    losses_o = run_steps(ours, opt_o, batches, micro=3)
    torch.testing.assert_close(torch.tensor(losses_o), torch.tensor(losses_e), rtol=1e-5, atol=1e-7)
    for p, q in zip(eager.parameters(), ours.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


def test_accumulated_grads_equal_eager_before_step(strict):
    eager, wrapped = twin(MLPClassifier)
    ours = ORTModule(wrapped)
    gen = torch.Generator().manual_seed(3)
    batches = [classifier_batch(5 + i, gen=gen) for i in range(3)]
    for m in (eager, ours):
        for b in batches:
            m(*b)[0].backward()
    assert_grads_close(eager, ours)


@pytest.mark.parametrize("case", CASES)
def test_eval_and_no_grad(strict, case):
    model_cls, make_batch = CASES[case]
    eager, wrapped = twin(model_cls)
    ours = ORTModule(wrapped)
    x, y = make_batch(9, gen=torch.Generator().manual_seed(4))
    with torch.no_grad():  # train mode, no grad: forward-only engine
        torch.testing.assert_close(ours(x, y)[1], eager(x, y)[1], rtol=1e-6, atol=1e-6)
    eager.eval(), ours.eval()
    assert not ours.module.training
    with torch.no_grad():
        for n in (9, 4, 17):
            x, y = make_batch(n)
            loss_o, out_o = ours(x, y)
            loss_e, out_e = eager(x, y)
            torch.testing.assert_close(out_o, out_e, rtol=1e-6, atol=1e-6)
            assert not out_o.requires_grad
    assert ours.export_count == 2  # one per module mode (train, eval), not per batch size


def test_two_forwards_then_one_backward(strict):
    """Several run contexts alive at once: a module called twice in one step."""
    eager, wrapped = twin(MLPClassifier)
    ours = ORTModule(wrapped)
    gen = torch.Generator().manual_seed(5)
    a, b = classifier_batch(4, gen=gen), classifier_batch(7, gen=gen)
    for m in (eager, ours):
        (m(*a)[0] + 2 * m(*b)[0]).backward()
    assert_grads_close(eager, ours)


def test_frozen_parameter_gets_no_grad(strict):
    eager, wrapped = twin(MLPClassifier)
    ours = ORTModule(wrapped)
    for m in (eager, ours):
        m.fc1.weight.requires_grad_(False)
        m(*classifier_batch(5, gen=torch.Generator().manual_seed(6)))[0].backward()
    assert ours.fc1.weight.grad is None
    for (n, p), (_, q) in zip(eager.named_parameters(), ours.named_parameters()):
        if p.requires_grad:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)


def test_input_gradient(strict):
    eager, wrapped = twin(Regressor)
    ours = ORTModule(wrapped)
    x, y = regression_batch(6, gen=torch.Generator().manual_seed(7))
    xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager(xe, y)[0].backward()
    ours(xo, y)[0].backward()
    torch.testing.assert_close(xo.grad, xe.grad, rtol=1e-4, atol=1e-6)
