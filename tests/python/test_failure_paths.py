"""Failure paths lose nothing: an exception at any stage of a training step (export,
engine build, forward, backward, optimizer step) leaves the parameters, their .grad, the buffers
and the optimizer state bitwise as before the step, and the module usable — the next steps match
eager PyTorch doing the same steps without the failed one. Copies (deepcopy, pickle, torch.save)
of an ORTModule are independent modules that train like eager."""
import copy
import gc
import io
import pickle
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F

import torch_ort
from torch_ort import ORTModule
from torch_ort.optim import FP16_Optimizer, FusedAdam, FusedLamb
from torch_ort.ortmodule.engine import bridge
from torch_ort.ortmodule.engine import runner as runner_mod
from torch_ort.ortmodule.policy.fallback_policy import ORTModuleTorchModelException

TINY = "0.000001"  # ORTMODULE_GRADIENT_RELEASE in MiB: nearly every parameter is its own group
VOCAB, WIDTH, CLASSES = 20, 8, 3


class Trip(torch.autograd.Function):
    """Identity whose forward or backward raises while its class flag says so (a PythonOp)."""
    fail_forward = False
    fail_backward = False
    backwards_before_failure = 0  # with fail_backward: backward calls that still succeed

    @staticmethod
    def forward(ctx, x):
        if Trip.fail_forward:
            raise ValueError("Trip.forward failed")
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        if Trip.fail_backward:
            if Trip.backwards_before_failure == 0:
                raise ValueError("Trip.backward failed")
            Trip.backwards_before_failure -= 1
        return g


@pytest.fixture(autouse=True)
def _trip_reset():
    Trip.fail_forward = Trip.fail_backward = False
    Trip.backwards_before_failure = 0
    yield
    Trip.fail_forward = Trip.fail_backward = False
    Trip.backwards_before_failure = 0


class Net(torch.nn.Module):
    """Embedding -> Linear -> BatchNorm (running stats updated in forward) -> Trip -> head. Trip
    sits early, so its backward runs after the head's gradient group was handed over."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.fc1 = torch.nn.Linear(WIDTH, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.fc2 = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, CLASSES)

    def forward(self, ids, y):
        if ids.dim() != 2:
            raise ValueError(f"ids must be (batch, tokens), got {ids.dim()} dims")
        h = self.bn(self.fc1(self.emb(ids).mean(1)))
        h = Trip.apply(torch.relu(h))
        h = torch.tanh(self.fc2(h))
        return F.cross_entropy(self.head(h), y)


def batch(seed, n=6, bad_index=False):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, 4), generator=g)
    if bad_index:
        ids[1, 2] = VOCAB + 3  # out of range for the Embedding
    return ids, torch.randint(0, CLASSES, (n,), generator=g)


def pair(seed=0):
    torch.manual_seed(seed)
    eager = Net()
    return eager, ORTModule(copy.deepcopy(eager))


# --- snapshots ---------------------------------------------------------------------------------

def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(v) for v in x)
    return copy.deepcopy(x)


def snapshot(model, opt=None, buffers=True):
    """Deep clones of everything a step may touch (`buffers`: BatchNorm's running statistics,
    which a forward that succeeded has moved, as in eager)."""
    return {
        "params": {n: _clone(p) for n, p in model.named_parameters()},
        "grads": {n: None if p.grad is None else _clone(p.grad) for n, p in model.named_parameters()},
        "buffers": {n: _clone(b) for n, b in model.named_buffers()} if buffers else None,
        "opt": None if opt is None else _clone(opt.state_dict()),
        "groups": None if opt is None else [{k: _clone(v) for k, v in g.items() if k != "params"}
                                            for g in opt.param_groups],
    }


def assert_same(a, b, where="snapshot"):
    """Bitwise equality (dtype, shape and every bit), None only where None."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), f"{where}: {a!r} vs {b!r}"
        assert a.dtype == b.dtype and a.shape == b.shape and a.layout == b.layout, where
        if a.layout == torch.strided:
            assert torch.equal(a.view(-1).view(torch.uint8) if a.dtype.is_floating_point else a,
                               b.view(-1).view(torch.uint8) if b.dtype.is_floating_point else b), where
        return
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys {list(a)} vs {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
        return
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
        return
    assert a == b, f"{where}: {a!r} vs {b!r}"


def train(model, opt, seeds, accumulate=1):
    losses = []
    for s in seeds:
        for k in range(accumulate):
            loss = model(*batch(100 * s + k))
            loss.backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses


def assert_trains_like(eager, ours, opt_e, opt_o, seeds=(5, 6, 7)):
    """The next steps work and match eager PyTorch doing the same steps."""
    losses_e, losses_o = train(eager, opt_e, seeds), train(ours, opt_o, seeds)
    torch.testing.assert_close(torch.tensor(losses_o), torch.tensor(losses_e), rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(eager.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=name)
    for (name, b), c in zip(eager.named_buffers(), ours.buffers()):
        torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-6, msg=name)


def warmed(accumulated: bool, seed=0):
    """Eager and ORTModule after one identical step (engines built, optimizer state present),
    then, when `accumulated`, one more backward each (.grad holds values to keep)."""
    eager, ours = pair(seed)
    opt_e, opt_o = FusedAdam(eager.parameters(), lr=1e-2), FusedAdam(ours.parameters(), lr=1e-2)
    train(eager, opt_e, [1])
    train(ours, opt_o, [1])
    if accumulated:
        for m in (eager, ours):
            m(*batch(2)).backward()
    return eager, ours, opt_e, opt_o


# --- forward ------------------------------------------------------------------------------------

@pytest.mark.parametrize("accumulated", [False, True], ids=["grads_none", "grads_accumulated"])
def test_a_kernel_error_in_forward_changes_nothing(strict, accumulated):
    eager, ours, opt_e, opt_o = warmed(accumulated)
    before = snapshot(ours, opt_o)
    with pytest.raises(torch_ort._C.KernelError, match="(?i)index"):
        ours(*batch(3, bad_index=True))
    assert_same(snapshot(ours, opt_o), before)  # BatchNorm's running stats included
    assert_trains_like(eager, ours, opt_e, opt_o)


@pytest.mark.parametrize("training", [True, False], ids=["training", "no_grad"])
def test_a_python_op_forward_raising_changes_nothing(strict, training):
    eager, ours, opt_e, opt_o = warmed(accumulated=True)
    before = snapshot(ours, opt_o)
    Trip.fail_forward = True
    with pytest.raises(ValueError, match="Trip.forward failed"), torch.set_grad_enabled(training):
        ours(*batch(3))
    Trip.fail_forward = False
    assert_same(snapshot(ours, opt_o), before)
    assert_trains_like(eager, ours, opt_e, opt_o)


# --- backward -----------------------------------------------------------------------------------

@pytest.mark.parametrize("release", ["0", TINY], ids=["one_group", "many_groups"])
@pytest.mark.parametrize("accumulated", [False, True], ids=["grads_none", "grads_accumulated"])
def test_a_python_op_backward_raising_restores_every_grad(strict, monkeypatch, release, accumulated):
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", release)
    eager, ours, opt_e, opt_o = warmed(accumulated)
    before = snapshot(ours, opt_o, buffers=False)
    arrived = []
    hooks = [p.register_post_accumulate_grad_hook(lambda p, n=n: arrived.append(n))
             for n, p in ours.named_parameters()]
    loss = ours(*batch(3))
    eager(*batch(3))  # the forward succeeds (running statistics move) in both
    Trip.fail_backward = True
    with pytest.raises(Exception, match="Trip.backward failed"):  # a KernelError naming the node
        loss.backward()
    Trip.fail_backward = False
    for h in hooks:
        h.remove()
    if release == TINY:  # the failure came after groups had been handed to PyTorch
        assert "head.weight" in arrived and "emb.weight" not in arrived
    assert_same(snapshot(ours, opt_o, buffers=False), before)
    del loss
    assert_trains_like(eager, ours, opt_e, opt_o)


@pytest.mark.parametrize("failing_call", ["second", "first"])
def test_a_module_called_twice_restores_the_grads_of_both_calls(strict, monkeypatch, failing_call):
    """One backward through two calls of the module. The second call's backward runs first; when
    the first call's backward fails, the second's has handed every group over and the parameters
    both calls feed have been accumulated: all go back to their values before the backward."""
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", TINY)
    eager, ours, opt_e, opt_o = warmed(accumulated=True)
    before = snapshot(ours, opt_o, buffers=False)
    arrived = []
    hooks = [p.register_post_accumulate_grad_hook(lambda p, n=n: arrived.append(n))
             for n, p in ours.named_parameters()]
    loss = ours(*batch(3)) + ours(*batch(4))
    eager(*batch(3)), eager(*batch(4))
    Trip.fail_backward = True
    Trip.backwards_before_failure = 1 if failing_call == "first" else 0
    with pytest.raises(Exception, match="Trip.backward failed"):  # a KernelError naming the node
        loss.backward()
    Trip.fail_backward = False
    for h in hooks:
        h.remove()
    assert ("head.weight" in arrived) == (failing_call == "first")
    assert_same(snapshot(ours, opt_o, buffers=False), before)
    del loss
    assert_trains_like(eager, ours, opt_e, opt_o)


class Plain(torch.nn.Module):
    """Net without the PythonOp: a backward of our own kernels only (no opaque code)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.head = (torch.nn.Linear(WIDTH, 16), torch.nn.Linear(16, 16),
                                         torch.nn.Linear(16, CLASSES))

    def forward(self, x, y):
        return F.cross_entropy(self.head(torch.tanh(self.fc2(torch.relu(self.fc1(x))))), y)


def _plain_batch(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, WIDTH, generator=g), torch.randint(0, CLASSES, (6,), generator=g)


def _handover_records(monkeypatch):
    """Every _Handover's records as they were when its backward call ended."""
    seen = []
    close = bridge._Handover.close
    monkeypatch.setattr(bridge._Handover, "close", lambda self: (seen.append(dict(self.records)), close(self)))
    return seen


@pytest.mark.parametrize("model_cls", [Net, Plain], ids=["python_op", "no_opaque_code"])
def test_existing_grads_are_copied_only_when_backward_runs_opaque_code(strict, monkeypatch, model_cls):
    """The copy of an early group's .grad (gradient accumulation) is made only for an engine whose
    backward runs user or ATen code; a .grad that was None is recorded either way (no copy)."""
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", TINY)
    torch.manual_seed(0)
    ours = ORTModule(model_cls())
    data = batch if model_cls is Net else _plain_batch
    seen = _handover_records(monkeypatch)
    ours(*data(1)).backward()  # .grad None: records without copies
    ours(*data(2)).backward()  # accumulating
    assert len(seen) == 2 and seen[0]
    assert all(grad is None and copy is None for _, grad, copy in seen[0].values())
    copies = [copy is not None for _, grad, copy in seen[1].values()]
    assert (copies and all(copies)) if model_cls is Net else not any(copies)


@pytest.mark.parametrize("accumulated", [False, True], ids=["grads_none", "grads_accumulated"])
def test_a_kernel_failure_without_opaque_code_restores_none_grads(strict, monkeypatch, accumulated):
    """A backward of our own kernels failing (injected: the second group's take raises, as an out
    of memory would): .grad that was None is None again; accumulated ones stay accumulated (no copy
    was made: the documented cost trade)."""
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", TINY)
    torch.manual_seed(0)
    ours = ORTModule(Plain())
    if accumulated:
        ours(*_plain_batch(1)).backward()
    before = snapshot(ours, buffers=False)
    loss = ours(*_plain_batch(2))
    real, taken = torch_ort._C.Engine.backward_take, []

    def take(engine, run, steps, inputs):
        taken.append(inputs)
        if len(taken) == 2:
            raise torch.OutOfMemoryError("injected: out of memory")
        return real(engine, run, steps, inputs)
    monkeypatch.setattr(torch_ort._C.Engine, "backward_take", take)
    with pytest.raises(torch.OutOfMemoryError):
        loss.backward()
    monkeypatch.setattr(torch_ort._C.Engine, "backward_take", real)
    first = [n for i, (n, _) in enumerate(ours.named_parameters()) if i + 2 in taken[0]]
    assert first  # a group was handed over (and accumulated) before the failure
    after = snapshot(ours, buffers=False)
    if not accumulated:
        assert_same(after, before)
    else:
        assert_same(after["params"], before["params"])
        for n in first:  # accumulated, not taken back
            assert not torch.equal(after["grads"][n], before["grads"][n]), n
    del loss
    ours(*_plain_batch(3)).backward()  # usable


class Boom(torch.autograd.Function):
    """Eager identity whose backward raises: a failure in user code outside our nodes."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise ValueError("Boom.backward failed")


def test_handover_records_do_not_outlive_a_backward_failing_in_user_code(strict, monkeypatch):
    """The records (and copies) of the .grad handed over early die with the backward call when
    user code after our nodes raises (autograd runs no final callback then), not with the graph."""
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", TINY)
    torch.manual_seed(0)
    ours = ORTModule(Plain())
    x, y = _plain_batch(1)
    made = []
    init = bridge._Handover.__init__

    def tracked(self):
        init(self)
        made.append(weakref.ref(self))
    monkeypatch.setattr(bridge._Handover, "__init__", tracked)
    x = x.clone().requires_grad_()
    loss = ours(Boom.apply(x), y)  # the user tensor's gradient (last group) reaches Boom
    with pytest.raises(ValueError, match="Boom.backward failed"):
        loss.backward()
    assert made
    gc.collect()
    assert all(ref() is None for ref in made)  # while `loss` (the graph) is still alive
    del loss


# --- export and engine build ----------------------------------------------------------------------

def test_an_export_failure_raises_and_the_next_call_exports(strict, monkeypatch):
    eager, ours = pair()
    opt_e, opt_o = FusedAdam(eager.parameters(), lr=1e-2), FusedAdam(ours.parameters(), lr=1e-2)
    real = torch.onnx.export

    def broken(*args, **kwargs):
        raise RuntimeError("injected exporter failure")
    monkeypatch.setattr(torch.onnx, "export", broken)
    before = snapshot(ours, opt_o)
    with pytest.raises(ORTModuleTorchModelException, match="injected exporter failure"):
        ours(*batch(3))
    assert_same(snapshot(ours, opt_o), before)
    assert not ours._plan_cache
    monkeypatch.setattr(torch.onnx, "export", real)
    assert_trains_like(eager, ours, opt_e, opt_o)
    assert not ours._fallback.active


@pytest.mark.parametrize("policy", ["FALLBACK_DISABLE", pytest.param("default", marks=pytest.mark.fallback)])
def test_a_forward_that_raises_while_exported_is_the_users_error_not_a_fallback(monkeypatch, policy):
    """The model's own forward raises on these inputs (while being exported). Under the default
    policy the eager module raises the same error: it propagates as in eager PyTorch, and the
    module does not switch to eager for good (nothing is warned); the next good call runs the
    engine."""
    if policy != "default":
        monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", policy)
    eager, ours, opt_e, opt_o = warmed(accumulated=True)
    before = snapshot(ours, opt_o)
    ids, y = batch(3)
    expected = ORTModuleTorchModelException if policy != "default" else ValueError
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        with pytest.raises(expected, match="ids must be"):
            ours(ids[:, :, None], y)  # a new schema (rank 3): exported, and forward raises
    assert_same(snapshot(ours, opt_o), before)
    assert not ours._fallback.active and ours._fallback.cause is None
    exports = ours.export_count
    assert_trains_like(eager, ours, opt_e, opt_o)
    assert ours.export_count == exports  # the engine of the good schema still runs


def test_an_engine_build_failure_changes_nothing_and_the_next_call_builds(strict, monkeypatch):
    eager, ours = pair()
    opt_e, opt_o = FusedAdam(eager.parameters(), lr=1e-2), FusedAdam(ours.parameters(), lr=1e-2)
    real = torch_ort._C.Engine
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("injected engine build failure")
    monkeypatch.setattr(torch_ort._C, "Engine", broken)
    before = snapshot(ours, opt_o)
    with pytest.raises(RuntimeError, match="injected engine build failure"):
        ours(*batch(3))
    assert_same(snapshot(ours, opt_o), before)
    monkeypatch.setattr(torch_ort._C, "Engine", real)
    assert_trains_like(eager, ours, opt_e, opt_o)
    assert calls and ours.engine_build_count == 1 and not ours._fallback.active


def test_a_failed_re_export_for_the_aten_fallback_leaves_no_runner_without_a_graph(strict, monkeypatch):
    """The engine build named ops for the ATen fallback, and the re-export failed: the runner,
    left without a graph, is dropped; the next call exports again."""
    eager, ours = pair()
    opt_e, opt_o = FusedAdam(eager.parameters(), lr=1e-2), FusedAdam(ours.parameters(), lr=1e-2)
    real_build, real_export = runner_mod.GraphRunner._build, runner_mod.export_with_fallback
    exports = []

    def export(*args, **kwargs):
        exports.append(1)
        if len(exports) == 2:
            raise ORTModuleTorchModelException("injected re-export failure")
        return real_export(*args, **kwargs)
    def export_again(self, *a):
        raise runner_mod.ExportAgain(runner_mod.Reason.ATEN_OPS, "injected")
    monkeypatch.setattr(runner_mod.GraphRunner, "_build", export_again)
    monkeypatch.setattr(runner_mod, "export_with_fallback", export)
    with pytest.raises(ORTModuleTorchModelException, match="injected re-export failure"):
        ours(*batch(3))
    assert not ours._plan_cache
    monkeypatch.setattr(runner_mod.GraphRunner, "_build", real_build)
    assert_trains_like(eager, ours, opt_e, opt_o)


# --- optimizers -----------------------------------------------------------------------------------

def _two_groups(model, cls, **kw):
    params = list(model.parameters())
    return cls([{"params": params[:3]}, {"params": params[3:], "lr": 5e-3}], lr=1e-2, **kw)


def _optim_pair(cls, fresh: bool, **kw):
    """Two identical eager models and optimizers, both with gradients; unless `fresh`, after one
    step (state present). The second one fails its step; the first never tries it."""
    torch.manual_seed(0)
    ref = Net()
    ours = copy.deepcopy(ref)
    opt_r, opt_o = _two_groups(ref, cls, **kw), _two_groups(ours, cls, **kw)
    if not fresh:
        train(ref, opt_r, [1])
        train(ours, opt_o, [1])
    for m in (ref, ours):
        m(*batch(2)).backward()
    return ref, ours, opt_r, opt_o


def _last(model):
    return list(model.parameters())[-1]


def _replace_grad(p, make):
    """p.grad becomes a new tensor holding make(gradient) — autograd's assignment checks bypassed
    through .data, as a buggy hook could — and the good gradient object stays untouched."""
    good = p.grad.detach().clone()
    p.grad = torch.zeros_like(p)
    p.grad.data = make(good)


FAULTS = {
    # a gradient the kernels cannot take, in a parameter of the LAST group
    "grad_dtype": lambda m, o: _replace_grad(_last(m), lambda g: g.half()),
    "grad_shape": lambda m, o: _replace_grad(_last(m), lambda g: g.reshape(1, -1)),  # same numel
    "grad_sparse": lambda m, o: setattr(_last(m), "grad", _last(m).grad.to_sparse()),
    # a hyper-parameter of the last group that only the step reads
    "bad_hyper": lambda m, o: o.param_groups[-1].update(BAD_HYPER[type(o)]),
}
BAD_HYPER = {FusedAdam: {"adam_w_mode": 7}, FusedLamb: {"ratio_min": -1.0}}


@pytest.mark.parametrize("fresh", [True, False], ids=["lazy_state", "existing_state"])
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("cls", [FusedAdam, FusedLamb])
def test_a_failed_optimizer_step_changes_nothing(cls, fault, fresh):
    ref, ours, opt_r, opt_o = _optim_pair(cls, fresh)
    good_grad = _last(ours).grad
    before = snapshot(ours, opt_o)
    FAULTS[fault](ours, opt_o)
    with pytest.raises((TypeError, ValueError, RuntimeError)):
        opt_o.step()
    # Undo the fault itself, then nothing else may have changed.
    _last(ours).grad = good_grad
    if fault == "bad_hyper":
        opt_o.param_groups[-1].update(before["groups"][-1])
    assert_same(snapshot(ours, opt_o), before)
    opt_r.step()
    opt_o.step()
    assert_same(snapshot(ours, opt_o), snapshot(ref, opt_r))  # bitwise: same steps, same kernels


@pytest.mark.parametrize("cls", [FusedAdam, FusedLamb])
def test_out_of_memory_while_creating_a_later_groups_state_leaves_no_state(cls, monkeypatch):
    ref, ours, opt_r, opt_o = _optim_pair(cls, fresh=True)
    before = snapshot(ours, opt_o)
    real = torch.zeros
    made = []

    def zeros(*args, **kwargs):
        made.append(1)
        if len(made) > 7:  # the first group's moments are made; a later one fails
            raise torch.OutOfMemoryError("injected: out of memory")
        return real(*args, **kwargs)
    monkeypatch.setattr(torch, "zeros", zeros)
    with pytest.raises(torch.OutOfMemoryError):
        opt_o.step()
    monkeypatch.setattr(torch, "zeros", real)
    assert len(opt_o.state) == 0
    assert_same(snapshot(ours, opt_o), before)
    opt_r.step()
    opt_o.step()
    assert_same(snapshot(ours, opt_o), snapshot(ref, opt_r))


def _fp16_pair(inner_cls, clipping: bool):
    """bf16 model (the head's bias kept fp32: its own master) under FP16_Optimizer(inner) with a
    loss scale: the step unscales (and clips) the fp32 parameter's gradient in place."""
    def build():
        torch.manual_seed(0)
        m = Net().to(torch.bfloat16)
        m.head.bias.data = m.head.bias.data.float()
        return m
    ref, ours = build(), build()
    opts = []
    for m in (ref, ours):
        opt = FP16_Optimizer(_two_groups(m, inner_cls), initial_scale=2.0 ** 8,
                             max_grad_norm=0.5 if clipping else None)
        for s in (1, 2):
            ids, y = batch(s)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = m(ids, y)
            opt.backward(loss)
            if s == 1:
                opt.step()
                opt.zero_grad()
        opts.append(opt)
    return ref, ours, *opts


def _fp16_snapshot(model, opt):
    return {"model": snapshot(model), "inner": _clone(opt.optimizer.state_dict()),
            "masters": [_clone(m) for m in opt.master_params],
            "scaler": dict(opt.scaler.state_dict()), "flags": (opt._scaled, opt.overflow)}


@pytest.mark.parametrize("fault", ["bad_hyper", "bad_hyper_clipping", "sparse_fp32_grad",
                                   "bf16_grad_shape"])
@pytest.mark.parametrize("inner_cls", [FusedAdam, FusedLamb])
def test_a_failed_fp16_optimizer_step_changes_nothing(inner_cls, fault):
    ref, ours, opt_r, opt_o = _fp16_pair(inner_cls, clipping=fault.endswith("clipping"))
    before = _fp16_snapshot(ours, opt_o)
    broken = ours.head.bias if fault != "bf16_grad_shape" else ours.head.weight  # fp32 / bf16
    good_grad, group = broken.grad, dict(opt_o.param_groups[-1])
    if fault == "sparse_fp32_grad":
        broken.grad = good_grad.to_sparse()
    elif fault == "bf16_grad_shape":
        _replace_grad(broken, lambda g: g.reshape(-1))  # same numel, wrong shape
    else:  # the inner optimizer fails at its last group, after the unscale (and clipping) ran
        opt_o.param_groups[-1].update(BAD_HYPER[inner_cls])
    with pytest.raises((TypeError, ValueError, RuntimeError)):
        opt_o.step()
    broken.grad = good_grad
    opt_o.param_groups[-1].update(group)
    assert_same(_fp16_snapshot(ours, opt_o), before)
    opt_r.step()
    opt_o.step()
    assert_same(_fp16_snapshot(ours, opt_o), _fp16_snapshot(ref, opt_r))


class FlakySGD(torch.optim.SGD):
    """A foreign inner optimizer whose step raises `failures` times (after FP16_Optimizer has
    unscaled and clipped: it has no check_step)."""
    failures = 0

    def step(self, closure=None):
        if FlakySGD.failures:
            FlakySGD.failures -= 1
            raise RuntimeError("FlakySGD.step failed")
        return super().step(closure)


@pytest.mark.parametrize("clipping", [False, True], ids=["no_clip", "clipping"])
def test_fp16_optimizer_after_a_foreign_inner_step_failed_retries_without_unscaling_twice(clipping):
    """Not undone (nothing is copied per step): the gradients stay unscaled, the scale stays; the
    retried step equals a step that never failed, bitwise."""
    ref, ours, opt_r, opt_o = _fp16_pair(FlakySGD, clipping)
    scale, scaled_grad = opt_o.loss_scale, ours.head.bias.grad.clone()
    FlakySGD.failures = 1
    with pytest.raises(RuntimeError, match="FlakySGD.step failed"):
        opt_o.step()
    assert opt_o.loss_scale == scale
    if not clipping:  # the fp32 parameter's gradient, unscaled in place (documented)
        torch.testing.assert_close(ours.head.bias.grad, scaled_grad / scale, rtol=0, atol=0)
    opt_o.step()
    opt_r.step()
    assert_same(_fp16_snapshot(ours, opt_o), _fp16_snapshot(ref, opt_r))


@pytest.mark.parametrize("inner_cls", [FusedAdam, FusedLamb])
def test_fp16_optimizer_step_copies_no_gradient(inner_cls, monkeypatch):
    """The hot path: loss scale != 1 and clipping on, and no clone of any gradient."""
    ref, ours, opt_r, opt_o = _fp16_pair(inner_cls, clipping=True)
    assert opt_o.loss_scale != 1.0
    clones = []
    real = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda t, *a, **k: (clones.append(t.shape), real(t, *a, **k))[1])
    opt_o.step()
    monkeypatch.setattr(torch.Tensor, "clone", real)
    assert clones == []
    opt_r.step()
    assert_same(_fp16_snapshot(ours, opt_o), _fp16_snapshot(ref, opt_r))


# --- copies ---------------------------------------------------------------------------------------

def _round_trip(module, how):
    if how == "deepcopy":
        return copy.deepcopy(module)
    if how == "pickle":
        return pickle.loads(pickle.dumps(module))
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch_save"])
@pytest.mark.parametrize("trained", [False, True], ids=["before_running", "after_training"])
def test_a_copy_is_an_independent_module_that_trains_like_eager(strict, how, trained):
    eager, ours = pair()
    opt_e, opt_o = FusedAdam(eager.parameters(), lr=1e-2), FusedAdam(ours.parameters(), lr=1e-2)
    if trained:
        train(eager, opt_e, [1, 2])
        train(ours, opt_o, [1, 2])
    twin = _round_trip(ours, how)
    assert isinstance(twin, ORTModule) and twin.module is not ours.module
    assert twin._settings == ours._settings and twin._debug == ours._debug
    for p, q in zip(ours.parameters(), twin.parameters()):
        assert p is not q and p.data_ptr() != q.data_ptr() and torch.equal(p, q)
    assert twin.export_count == 0 and not twin._plan_cache
    with torch.no_grad():  # identical outputs (BatchNorm's statistics move in all three)
        assert torch.equal(twin(*batch(9)), ours(*batch(9)))
        eager(*batch(9))
    assert twin.export_count == 1, "the copy exports on its own"
    # Both go on, on different data, each like its own eager model.
    eager_twin = copy.deepcopy(eager)
    opt_t = FusedAdam(twin.parameters(), lr=1e-2)
    opt_et = FusedAdam(eager_twin.parameters(), lr=1e-2)
    if trained:
        opt_t.load_state_dict(opt_o.state_dict())
        opt_et.load_state_dict(opt_e.state_dict())
    assert_trains_like(eager, ours, opt_e, opt_o, seeds=(3, 4))
    assert_trains_like(eager_twin, twin, opt_et, opt_t, seeds=(7, 8, 9))
    assert not torch.equal(ours.head.weight, twin.head.weight)
    assert {id(r) for r in twin._plan_cache.runners()}.isdisjoint(id(r) for r in ours._plan_cache.runners())


def test_a_copy_keeps_a_python_op_working(strict, monkeypatch):
    monkeypatch.setenv("ORTMODULE_GRADIENT_RELEASE", TINY)
    eager, ours = pair()
    ours(*batch(1)).backward()
    twin = pickle.loads(pickle.dumps(ours))
    Trip.fail_backward = True  # the copy's own PythonOp node calls the Function
    loss = twin(*batch(1))
    with pytest.raises(Exception, match="Trip.backward failed"):  # a KernelError naming the node
        loss.backward()
    Trip.fail_backward = False
    assert all(p.grad is None for p in twin.parameters())
    del loss
    eager.zero_grad(set_to_none=True)
    eager(*batch(1)).backward()
    twin(*batch(1)).backward()
    for (name, p), q in zip(eager.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_a_copy_of_a_module_in_eager_fallback_stays_in_fallback(monkeypatch):
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_FORCE_TORCH_FORWARD")
    with pytest.warns(UserWarning, match="eager"):
        eager, ours = pair()
    ours(*batch(1)).backward()
    for how in ("deepcopy", "pickle"):
        twin = _round_trip(ours, how)
        assert twin._fallback.active
        twin(*batch(2)).backward()
        assert twin.export_count == 0 and all(p.grad is not None for p in twin.parameters())
