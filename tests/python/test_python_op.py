"""PythonOp: custom torch.autograd.Functions run their own forward and backward inside the engine
(FALLBACK_DISABLE: nothing runs in eager), with eager parity; inlined when custom autograd is off."""
import pytest
import torch

from torch_ort import ORTModule
from torch_ort.ortmodule.export import python_op


class StraightThrough(torch.autograd.Function):
    """Rounds in forward; passes the gradient through unchanged (NOT the derivative: zero)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, g):
        return g


class GradReverse(torch.autograd.Function):
    """Identity forward; backward multiplies by -scale (a non-tensor argument)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -ctx.scale * g, None


class ClampWithMask(torch.autograd.Function):
    """Two outputs, one non-differentiable (a float mask); non-tensor args; saves tensors."""
    calls = {"forward": 0, "backward": 0, "needs": None}

    @staticmethod
    def forward(ctx, x, w, low, high):
        ClampWithMask.calls["forward"] += 1
        mask = ((x > low) & (x < high)).to(x.dtype)
        ctx.save_for_backward(mask, w)
        ctx.mark_non_differentiable(mask)
        return x.clamp(low, high) * w, mask

    @staticmethod
    def backward(ctx, g, g_mask):
        ClampWithMask.calls["backward"] += 1
        ClampWithMask.calls["needs"] = tuple(ctx.needs_input_grad)
        mask, w = ctx.saved_tensors
        gx = g * mask * w if ctx.needs_input_grad[0] else None
        return gx, None, None, None   # w gets a None gradient: zeros, as in eager


class ScaleInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return 2 * g


class Net(torch.nn.Module):
    def __init__(self, fn="ste"):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.w = torch.nn.Parameter(torch.full((8,), 0.5))
        self.fn = fn

    def forward(self, x):
        h = self.fc1(x)
        if self.fn == "ste":
            h = StraightThrough.apply(h)
        elif self.fn == "reverse":
            h = GradReverse.apply(h, 0.3)
        elif self.fn == "mask":
            h, mask = ClampWithMask.apply(h, self.w, -0.5, 0.5)
            h = h + mask
        elif self.fn == "mask_shared":  # w also used outside: its None part meets a real one
            h, mask = ClampWithMask.apply(h, self.w, -0.5, 0.5)
            h = h + mask * self.w
        elif self.fn == "dirty":
            h = ScaleInPlace.apply(h * 1.0)
        return self.fc2(torch.tanh(h)).pow(2).mean()


def _train_pair(fn, steps=5, monkeypatch=None):
    torch.manual_seed(0)
    eager = Net(fn)
    ours = Net(fn)
    ours.load_state_dict(eager.state_dict())
    wrapped = ORTModule(ours)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_o = torch.optim.SGD(ours.parameters(), lr=0.1)
    for step in range(steps):
        x = torch.randn(4 + step, 6)
        le, lo = eager(x), wrapped(x)
        le.backward()
        lo.backward()
        for (n, pe), po in zip(eager.named_parameters(), ours.parameters()):
            if pe.grad is None:  # unused, or a None gradient from backward(): None here too
                assert po.grad is None, f"{fn} step {step} {n}: {po.grad}"
                continue
            torch.testing.assert_close(po.grad, pe.grad, rtol=1e-5, atol=1e-6, msg=f"{fn} step {step} {n}")
        torch.testing.assert_close(lo, le, rtol=1e-5, atol=1e-6)
        opt_e.step(), opt_o.step(), opt_e.zero_grad(), opt_o.zero_grad()
    return wrapped


@pytest.mark.parametrize("fn", ["ste", "reverse", "dirty"])
def test_function_backward_is_its_own(strict, fn):
    wrapped = _train_pair(fn)
    assert wrapped.export_count == 1
    runner = next(iter(wrapped._plan_cache.runners()))
    assert runner.export.python_ops, "the Function must run as a PythonOp, not inlined"


def test_non_tensor_args_two_outputs_one_non_differentiable(strict):
    ClampWithMask.calls.update(forward=0, backward=0)
    _train_pair("mask", steps=4)
    # Eager ran 4 forwards and 4 backwards; ours as many again, plus the export's one probe.
    assert ClampWithMask.calls["backward"] == 8
    assert ClampWithMask.calls["forward"] == 9
    assert ClampWithMask.calls["needs"] == (True, True, False, False)


def test_none_gradient_next_to_a_real_one(strict):
    _train_pair("mask_shared", steps=3)


def test_backward_runs_once_per_forward_and_not_without_backward(strict):
    torch.manual_seed(0)
    model = ORTModule(Net("mask"))
    ClampWithMask.calls.update(forward=0, backward=0)
    x = torch.randn(3, 6)
    first = model(x)          # export (probe) + run
    second = model(x)         # a second forward in flight
    (first + second).backward()
    assert ClampWithMask.calls["backward"] == 2
    with torch.no_grad():
        model(x)
    assert ClampWithMask.calls["backward"] == 2


def test_frozen_input_gets_needs_input_grad_false(strict):
    torch.manual_seed(0)
    net = Net("mask")
    net.w.requires_grad_(False)
    model = ORTModule(net)
    model(torch.randn(3, 6)).backward()
    assert ClampWithMask.calls["needs"] == (True, False, False, False)


@pytest.mark.parametrize("var,value", [("ORTMODULE_ENABLE_CUSTOM_AUTOGRAD", "0"),
                                       ("ORTMODULE_DISABLE_CUSTOM_AUTOGRAD_SUPPORT", "1"),
                                       ("ORTMODULE_SKIPPED_AUTOGRAD_FUNCTIONS",
                                        f"{__name__}.StraightThrough")])
def test_disabled_custom_autograd_inlines_the_forward(strict, monkeypatch, var, value):
    """Documented: inlined, the backward is the derivative of the forward (round: zero), so the
    straight-through gradient is lost and fc1 gets no gradient at all."""
    monkeypatch.setenv(var, value)
    torch.manual_seed(0)
    net = Net("ste")
    model = ORTModule(net)
    model(torch.randn(4, 6)).backward()
    runner = next(iter(model._plan_cache.runners()))
    assert runner.export.python_ops == []
    assert torch.count_nonzero(net.fc1.weight.grad) == 0
    assert torch.count_nonzero(net.fc2.weight.grad) > 0


def test_forward_error_is_raised_as_itself(strict):
    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            if x.shape[0] == 7:
                raise ValueError("seven rows are not allowed")
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def forward(self, x):
            return Boom.apply(self.fc(x)).sum()

    model = ORTModule(M())
    model(torch.randn(2, 3)).backward()
    with pytest.raises(ValueError, match="seven rows"):
        model(torch.randn(7, 3))


def test_unregistered_id_is_refused():
    with pytest.raises(RuntimeError, match="not registered in this process"):
        python_op.run(10**9, [torch.ones(1)], False)


def test_registry_entries_die_with_the_graph(strict):
    model = ORTModule(Net("ste"))
    model(torch.randn(2, 6))
    ids = [i for i, s in python_op._SITES.items() if s.function is StraightThrough]
    assert ids
    del model
    import gc
    gc.collect()
    assert not any(python_op.registered(i) for i in ids)


def test_a_model_file_cannot_name_python_to_run(tmp_path, monkeypatch):
    """A hand-written graph whose PythonOp node names a module, a class and an id this process never
    registered: the engine builds (the node is opaque), the call fails naming the id, and nothing
    named in the file is imported or run."""
    import sys

    import onnx
    from onnx import TensorProto, helper

    import torch_ort

    marker = tmp_path / "imported"
    (tmp_path / "hostile_module.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                                "class Fn:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    node = helper.make_node("PythonOp", ["x"], ["y"], domain="com.torch_ort", func_id=987654321,
                            module="hostile_module", qualname="Fn", source="import os")
    node.attribute.append(helper.make_attribute("name", "hostile_module.Fn"))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.torch_ort", 1)])
    python_op.install()  # as ORTModule does: PythonOp nodes call back into the registry
    for training in (False, True):
        engine = torch_ort._C.Engine(model.SerializeToString(), training, [training], [], 0, [])
        x = torch.ones(2, requires_grad=training)
        with pytest.raises(RuntimeError, match="PythonOp id 987654321 is not registered in this process"):
            engine.forward([x])
    assert "hostile_module" not in sys.modules
    assert not marker.exists()


def test_an_aten_op_node_runs_only_aten_operators():
    """The ATen fallback node calls the dispatcher by name: a model file naming an operator outside
    aten:: (Python-implemented torch.library ops, collectives) that no export of this process
    routed is refused at the call."""
    from onnx import TensorProto, helper

    import torch_ort

    node = helper.make_node("ATenOp", ["x"], ["y"], domain="com.torch_ort",
                            aten_op="_c10d_functional::all_reduce.default")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.torch_ort", 1)])
    engine = torch_ort._C.Engine(model.SerializeToString(), False, [False], [], 0, [])
    assert "_c10d_functional::all_reduce.default" not in torch_ort._C.allowed_library_ops()
    with pytest.raises(RuntimeError, match="runs aten:: operators and the operators of other libraries that "
                                           "this process routed.*_c10d_functional::all_reduce"):
        engine.forward([torch.ones(2)])
