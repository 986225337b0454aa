"""Gradient release (bridge.py): parameter gradients reach PyTorch in groups while the engine's
backward still runs — in the order they become final, with eager's values, safe for hooks that
update a parameter as soon as its gradient arrives, and never one tensor as two .grads."""
import copy

import pytest
import torch
import torch.nn.functional as F

import torch_ort
from torch_ort.ortmodule.engine import bridge

TINY = "0.000001"  # MiB: every parameter whose gradient is final at a new step starts a group


class Stack(torch.nn.Module):
    def __init__(self, width=16, depth=4):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))
        self.head = torch.nn.Linear(width, 3)

    def forward(self, x, y):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return F.cross_entropy(self.head(x), y)


class LeftStack(Stack):
    """Each mixing matrix is the left operand of a MatMul: the gradient rule emits dA = dY·Bᵀ
    (the matrix's gradient, final) before dB = Aᵀ·dY, which still reads the matrix."""

    def __init__(self, width=16, depth=4):
        super().__init__(width, depth)
        self.mix = torch.nn.ParameterList(torch.nn.Parameter(torch.eye(width) + 0.1 * torch.randn(width, width))
                                          for _ in range(depth))

    def forward(self, x, y):
        for layer, mix in zip(self.layers, self.mix):
            x = torch.matmul(mix, torch.tanh(layer(x)).T).T
        return F.cross_entropy(self.head(x), y)


def batch(seed=0, n=8, width=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, width, generator=g), torch.randint(0, 3, (n,), generator=g)


def release_nodes(loss):
    """The Release nodes reachable from loss (one per gradient group)."""
    seen, stack, found = set(), [loss.grad_fn], 0
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        found += type(fn).__name__ == "ReleaseBackward"
        stack.extend(f for f, _ in fn.next_functions)
    return found


def arrival_order(model, x, y):
    order = []
    hooks = [p.register_post_accumulate_grad_hook(lambda p, n=n: order.append(n))
             for n, p in model.named_parameters()]
    model(x, y).backward()
    for h in hooks:
        h.remove()
    return order


def test_groups_follow_backward_and_gradients_match_eager(strict, monkeypatch):
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", TINY)
    torch.manual_seed(0)
    eager = Stack()
    ort = torch_ort.ORTModule(copy.deepcopy(eager))
    x, y = batch()
    loss = ort(x, y)
    assert release_nodes(loss) >= 5  # head, then each layer: gradients final at different steps
    loss.backward()
    eager(x, y).backward()
    for (name, p), q in zip(ort.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
    for p in ort.parameters():
        p.grad = None
    order = arrival_order(ort, x, y)
    layer_of = [n.split(".")[0] + n.split(".")[1] if n.startswith("layers") else "head" for n in order]
    first_seen = list(dict.fromkeys(layer_of))
    assert first_seen == ["head", "layers3", "layers2", "layers1", "layers0"]  # as eager's


def test_release_off_is_one_group_at_the_end(strict, monkeypatch):
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", "0")
    torch.manual_seed(0)
    ort = torch_ort.ORTModule(Stack())
    loss = ort(*batch())
    assert release_nodes(loss) == 1
    loss.backward()
    assert all(p.grad is not None for p in ort.parameters())


def test_plan_cuts_groups_at_the_byte_threshold():
    class FakeEngine:  # five parameters whose gradients are final after steps 1, 1, 2, 3, 5
        input_grad_ready = [-1, 1, 1, 2, 3, 5]
        backward_runs_opaque_code = False
    params = [torch.zeros(256)] * 5  # 1 KiB each
    plan = bridge.ReleasePlan.build(FakeEngine(), 1, params, 2048)
    assert [(g.steps, g.inputs) for g in plan.groups] == [(1, (1, 2)), (3, (3, 4)), (-1, (0, 5))]
    assert [g.inputs for g in bridge.ReleasePlan.build(FakeEngine(), 1, params, 0).groups] == \
        [(0, 1, 2, 3, 4, 5)]


def test_a_hook_may_update_the_parameter_as_its_gradient_arrives(strict, monkeypatch):
    """Optimizer-in-backward: each parameter is stepped (in place) from its post-accumulate hook.
    A parameter's gradient is only released once no later backward step reads the parameter, so
    the remaining gradients are eager's."""
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", TINY)
    torch.manual_seed(0)
    eager = LeftStack()
    ort = torch_ort.ORTModule(copy.deepcopy(eager))

    def sgd_step(p):
        with torch.no_grad():
            p.add_(p.grad, alpha=-0.5)

    def step_in_backward(model):
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(sgd_step)
    step_in_backward(eager)
    step_in_backward(ort)
    for seed in range(3):
        x, y = batch(seed)
        for m in (eager, ort):
            for p in m.parameters():
                p.grad = None
        ort(x, y).backward()
        eager(x, y).backward()
        for (name, p), q in zip(ort.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_accumulation_and_autograd_grad(strict, monkeypatch):
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", TINY)
    torch.manual_seed(0)
    eager = Stack()
    ort = torch_ort.ORTModule(copy.deepcopy(eager))
    for seed in range(2):  # two backward calls accumulate into .grad
        x, y = batch(seed)
        ort(x, y).backward()
        eager(x, y).backward()
    for p, q in zip(ort.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    x, y = batch(5)
    wanted = [ort.module.layers[0].weight, ort.module.head.bias]
    got = torch.autograd.grad(ort(x, y), wanted)
    ref = torch.autograd.grad(eager(x, y), [eager.layers[0].weight, eager.head.bias])
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class SharedGrad(torch.nn.Module):
    """d(loss)/dx and d(loss)/d(shift) are one value of the gradient graph."""

    def __init__(self):
        super().__init__()
        self.shift = torch.nn.Parameter(torch.randn(4, 8))
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return (self.proj(x + self.shift) ** 2).mean()


def test_a_gradient_shared_by_an_input_and_a_parameter_is_two_tensors(strict, monkeypatch):
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", TINY)
    torch.manual_seed(0)
    eager = SharedGrad()
    ort = torch_ort.ORTModule(copy.deepcopy(eager))
    x = torch.randn(4, 8, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    ort(x).backward()
    eager(x2).backward()
    shift = ort.module.shift
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shift.grad, eager.shift.grad, rtol=1e-5, atol=1e-6)
    assert x.grad.data_ptr() != shift.grad.data_ptr()
    shift.grad.mul_(0)  # one .grad changing must not change the other
    torch.testing.assert_close(x.grad, x2.grad)


def test_a_second_backward_is_a_clear_error(strict, monkeypatch):
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", TINY)
    ort = torch_ort.ORTModule(Stack())
    loss = ort(*batch())
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward through the same ORTModule output twice"):
        loss.backward()


def test_bad_release_size_names_the_variable(monkeypatch):
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", "-1")
    with pytest.raises(ValueError, match="ORTMODULE_GRADIENT_RELEASE"):
        torch_ort.ORTModule(Stack())


class PassThrough(torch.nn.Module):
    """Returns a parameter, an input and a view of the input beside the loss."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.b = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return (self.fc(x) + self.b).pow(2).mean(), self.b, x, x.view(-1)


def test_outputs_that_are_inputs_or_parameters_stay_what_they_were(strict):
    torch.manual_seed(0)
    eager = PassThrough()
    ours = torch_ort.ORTModule(copy.deepcopy(eager))
    x = torch.randn(3, 4, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    loss, b, same_x, flat = ours(x)
    ref_loss, ref_b, ref_x, ref_flat = eager(x2)
    assert ours.module.b.is_leaf and ours.module.b.grad_fn is None  # not moved into the graph
    (loss + b.sum() + same_x.sum() + flat.pow(2).sum()).backward()
    (ref_loss + ref_b.sum() + ref_x.sum() + ref_flat.pow(2).sum()).backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-5, atol=1e-6)
    for p, q in zip(ours.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    ours(x)[0].backward()  # and the module keeps training


def _state(loss):
    return loss.grad_fn.state  # EngineFunction's ctx holds the call's shared backward state


def test_a_backward_that_needs_only_early_groups_frees_the_run(strict, monkeypatch):
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", TINY)
    ours = torch_ort.ORTModule(Stack())
    loss = ours(*batch())
    (g,) = torch.autograd.grad(loss, [ours.module.head.weight])  # the first group only
    assert g.shape == ours.module.head.weight.shape
    assert _state(loss).run is None and _state(loss).run_ctx is None


class Explode(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        raise ValueError("function backward failed")


class ExplodingStack(Stack):
    def forward(self, x, y):
        return super().forward(Explode.apply(self.layers[0](x)), y)  # fails late in backward


def test_an_error_inside_the_engines_backward_frees_the_run(strict, monkeypatch):
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", TINY)
    ours = torch_ort.ORTModule(ExplodingStack())
    loss = ours(*batch())
    with pytest.raises(Exception, match="function backward failed"):
        loss.backward()
    assert ours.module.head.weight.grad is None  # early groups had arrived, and were taken back
    assert _state(loss).run is None


def test_an_error_in_a_hook_keeps_nothing_once_the_loss_is_gone(strict, monkeypatch):
    """As in eager, the graph's unrun part is kept until the caller drops the loss, then freed."""
    import gc
    import weakref
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", TINY)
    ours = torch_ort.ORTModule(Stack())
    loss = ours(*batch())

    def boom(_):
        raise ValueError("hook failed")
    handle = ours.module.head.weight.register_post_accumulate_grad_hook(boom)
    with pytest.raises(ValueError, match="hook failed") as failure:
        loss.backward()
    state = weakref.ref(_state(loss))
    del loss, failure  # the traceback's frames hold the loss too
    handle.remove()
    # PyTorch leaves a failed backward's ready nodes in the thread's queue until the next backward
    # on this thread drains them — eager nodes and ours alike.
    ours(*batch()).backward()  # the module still trains
    gc.collect()
    assert state() is None
