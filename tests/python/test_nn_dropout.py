"""Dropout against eager PyTorch: the same torch seed draws the same mask, bit for bit, and backward
reuses the forward's mask (it never draws again)."""
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

from conftest import twin
from torch_ort import ORTModule, _C

DTYPES = {torch.float32: TensorProto.FLOAT, torch.float16: TensorProto.FLOAT16,
          torch.bfloat16: TensorProto.BFLOAT16, torch.float64: TensorProto.DOUBLE}


def dropout_model(dtype, p):
    """Dropout(x, ratio as float64, training_mode=True) -> (y, mask), as our translation exports it."""
    vi = helper.make_tensor_value_info
    ratio = helper.make_tensor("ratio", TensorProto.DOUBLE, [], [p])
    train = helper.make_tensor("train", TensorProto.BOOL, [], [True])
    node = helper.make_node("Dropout", ["x", "ratio", "train"], ["y", "mask"], name="/drop/Dropout")
    graph = helper.make_graph([node], "dropout", [vi("x", DTYPES[dtype], ["n", "m"])],
                              [vi("y", DTYPES[dtype], ["n", "m"]), vi("mask", TensorProto.BOOL, ["n", "m"])],
                              initializer=[ratio, train])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10).SerializeToString()


@pytest.mark.parametrize("p", [0.1, 0.15, 0.33, 0.9])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dropout_matches_eager_bit_for_bit(dtype, p):
    x = torch.randn(257, 31).to(dtype)
    engine = _C.Engine(dropout_model(dtype, p), True, [True])
    xe = x.clone().requires_grad_()
    torch.manual_seed(11)
    want = F.dropout(xe, p, training=True)
    dy = torch.randn(want.shape).to(dtype)
    want_dx, = torch.autograd.grad(want, xe, dy)
    torch.manual_seed(11)
    (y, mask), ctx = engine.forward([x])
    dx, = engine.backward(ctx, [dy, None])
    assert torch.equal(mask, want != 0), "mask differs from eager's"
    assert torch.equal(y, want.detach()), "forward values differ from eager F.dropout"
    assert torch.equal(dx, want_dx), "gradient differs from eager autograd"


def test_backward_reuses_the_forward_mask():
    x = torch.randn(64, 48)
    engine = _C.Engine(dropout_model(torch.float32, 0.4), True, [True])
    torch.manual_seed(5)
    (y, mask), ctx = engine.forward([x])
    torch.manual_seed(1234)  # a different generator state: a second draw would differ
    dy = torch.randn(64, 48)
    state = torch.get_rng_state()
    dx, = engine.backward(ctx, [dy, None])
    assert torch.equal(torch.get_rng_state(), state), "backward consumed random numbers"
    assert torch.equal(dx, dy * (mask.float() / (1 - 0.4))), "backward did not use the forward mask"
    assert 0.3 < 1 - mask.float().mean().item() < 0.5
    # Structure: one Dropout in the whole training graph (forward); its mask feeds DropoutGrad.
    tg = onnx.load_from_string(engine.training_graph_onnx()).graph
    drops = [n for n in tg.node if n.op_type == "Dropout"]
    grads = [n for n in tg.node if n.op_type == "DropoutGrad"]
    assert len(drops) == 1 and len(grads) == 1
    assert grads[0].input[1] == drops[0].output[1]
    assert not any("Bernoulli" in n.op_type or "Random" in n.op_type for n in tg.node)


class Stack(torch.nn.Module):
    """Three dropouts in sequence, between layers: the engine must draw them in eager's order."""

    def __init__(self, p=0.25):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(12, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)
        self.drop = torch.nn.Dropout(p)

    def forward(self, x, y):
        h = self.drop(torch.tanh(self.fc1(self.drop(x))))
        logits = self.fc3(self.drop(torch.tanh(self.fc2(h))))
        return F.cross_entropy(logits, y), h


def test_model_with_dropout_matches_eager_over_steps(strict):
    eager, wrapped = twin(Stack)
    ours = ORTModule(wrapped)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_o = torch.optim.SGD(ours.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(3)
    for step in range(6):
        x, y = torch.randn(8 + step, 12, generator=gen), torch.randint(0, 4, (8 + step,), generator=gen)
        torch.manual_seed(100 + step)
        loss_e, h_e = eager(x, y)
        loss_e.backward()
        torch.manual_seed(100 + step)
        loss_o, h_o = ours(x, y)  # the first call also exports: that must not consume the generator
        loss_o.backward()
        assert torch.equal(h_o == 0, h_e == 0), f"step {step}: dropout masks differ from eager"
        torch.testing.assert_close(loss_o, loss_e, rtol=1e-6, atol=1e-7)
        for (name, p), q in zip(eager.named_parameters(), ours.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
        opt_e.step(), opt_o.step()
        opt_e.zero_grad(), opt_o.zero_grad()
    assert ours.export_count == 1


def test_eval_mode_dropout_is_identity(strict):
    eager, wrapped = twin(Stack)
    ours = ORTModule(wrapped).eval()
    eager.eval()
    x, y = torch.randn(5, 12), torch.randint(0, 4, (5,))
    torch.testing.assert_close(ours(x, y)[0], eager(x, y)[0])
