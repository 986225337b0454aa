"""Operators registered by other libraries (torch.library: transformers, Liger, the user's own)
with no ONNX translation run inside the engine's graph as ATen fallback nodes: called through the
dispatcher with their registered autograd, exported once, shapes from their fake implementation.
transformers' grouped_mm operator (the experts of its mixture-of-experts models) is the exception:
it exports to our native GroupedMatMul."""
import copy

import onnx
import pytest
import torch
import torch.nn.functional as F
import transformers

from torch_ort import ORTModule, _C
from torch_ort.ortmodule import ORTModuleTorchModelException

torch_ctc_loss = F.ctc_loss


@torch.library.custom_op("torch_ort_test::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x, scale):
    return torch.empty_like(x)


CALLS = {"backward": 0}


def _setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.scale = inputs[1]


def _backward(ctx, grad):
    CALLS["backward"] += 1  # the registered autograd is what differentiates it
    (y,) = ctx.saved_tensors
    return grad * (ctx.scale - y * y / ctx.scale), None


scaled_tanh.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("torch_ort_test::no_fake", mutates_args=())
def no_fake(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class WithCustomOp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(scaled_tanh(self.fc1(x), 1.5)).pow(2).mean()


class WithoutFake(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return no_fake(self.fc(x)).sum()


def _training_graph(ours):
    (runner,) = ours._plan_cache.runners()
    (engine,) = runner._engines.values()
    return onnx.load_from_string(engine.training_graph_onnx()).graph


def _aten_ops(ours):
    graph = _training_graph(ours)
    return {a.s.decode() for n in graph.node if n.op_type == "ATenOp" for a in n.attribute if a.name == "aten_op"}


def _train_with_parity(make, batches, lr=1e-2, loss_of=lambda out: out, **kw):
    torch.manual_seed(0)
    eager = make()
    ours = ORTModule(copy.deepcopy(eager))
    opts = [torch.optim.AdamW(m.parameters(), lr=lr) for m in (eager, ours)]
    for batch in batches:
        losses = []
        for m, opt in zip((eager, ours), opts):
            opt.zero_grad()
            loss = loss_of(m(*batch, **kw)) if isinstance(batch, tuple) else loss_of(m(**batch, **kw))
            loss.backward()
            losses.append(loss)
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-6)
        for (name, pe), po in zip(eager.named_parameters(), ours.parameters()):
            assert (po.grad is None) == (pe.grad is None), name
            if pe.grad is not None:
                torch.testing.assert_close(po.grad, pe.grad, rtol=1e-3, atol=1e-5, msg=lambda m: f"{name}: {m}")
        for opt in opts:
            opt.step()
    return ours


def test_user_custom_op_runs_in_the_graph_with_its_autograd(strict):
    g = torch.Generator().manual_seed(1)
    before = CALLS["backward"]
    ours = _train_with_parity(WithCustomOp, [(torch.randn(n, 6, generator=g),) for n in (4, 7, 5)])
    assert ours.export_count == 1
    assert _aten_ops(ours) == {"torch_ort_test::scaled_tanh.default"}
    assert CALLS["backward"] - before == 6  # eager's three and the engine's three
    assert "torch_ort_test::scaled_tanh.default" in _C.allowed_library_ops()


def test_custom_op_without_fake_implementation_is_named(strict):
    with pytest.raises(ORTModuleTorchModelException, match=r"no fake impl registered for .*torch_ort_test::no_fake"):
        ORTModule(WithoutFake())(torch.randn(2, 4)).backward()


def _mixtral(layers=2):
    cfg = transformers.MixtralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.02)
    return transformers.MixtralForCausalLM(cfg)


def _qwen2_moe(layers=2):
    cfg = transformers.Qwen2MoeConfig(vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=32, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                                      num_experts_per_tok=2, decoder_sparse_step=1, output_router_logits=True)
    return transformers.Qwen2MoeForCausalLM(cfg)


@pytest.mark.parametrize("make", [_mixtral, _qwen2_moe], ids=["mixtral", "qwen2_moe"])
def test_moe_with_grouped_mm_trains_in_the_engine(strict, make):
    """Token-to-expert routing (TopK, one-hot, scatter) runs on our kernels, the experts' grouped_mm
    as our GroupedMatMul and its gradient (no call back into transformers' Python loop); the
    load-balancing loss included, every sequence length dynamic, one export."""
    assert make().config._experts_implementation == "grouped_mm"
    g = torch.Generator().manual_seed(0)
    batches = []
    for t in (8, 11, 6):
        ids = torch.randint(0, 128, (2, t), generator=g)
        batches.append(dict(input_ids=ids, labels=ids))
    ours = _train_with_parity(make, batches, loss_of=lambda out: out.loss)
    assert ours.export_count == 1
    assert _aten_ops(ours) == set()
    ops = [n.op_type for n in _training_graph(ours).node]
    assert ops.count("GroupedMatMul") == 2 * 2 and ops.count("GroupedMatMulGrad") == 2 * 2  # up, down per layer
    # transformers passes the experts' weights transposed; their gradients come back in the
    # weights' own layout, so autograd keeps them instead of copying each one.
    incoming = []
    for p in ours.parameters():
        if p.dim() == 3:
            p.register_hook(lambda grad, p=p: incoming.append(grad.stride() == p.stride()))
    ours(**batches[0]).loss.backward()
    assert len(incoming) == 2 * 2 and all(incoming)


class WithCTC(torch.nn.Module):
    """A CTC head over frames: F.ctc_loss, whose ATen kernel sizes an output by the target lengths'
    values, runs as torch_ort::ctc_loss."""

    def __init__(self, reduction, zero_infinity=False):
        super().__init__()
        self.fc = torch.nn.Linear(6, 5)
        self.reduction, self.zero_infinity = reduction, zero_infinity

    def forward(self, x, targets, input_lengths, target_lengths):
        log_probs = self.fc(x).log_softmax(-1).transpose(0, 1)  # (T, B, C)
        loss = F.ctc_loss(log_probs, targets, input_lengths, target_lengths, reduction=self.reduction,
                          zero_infinity=self.zero_infinity)
        return loss if loss.dim() == 0 else loss.square().mean()


@pytest.mark.parametrize("reduction,zero_infinity", [("sum", False), ("none", True), ("mean", True)])
def test_ctc_loss_runs_in_the_graph(strict, reduction, zero_infinity):
    """Padded (B, S) targets; the last call's second target cannot fit its frames (loss inf: zeroed
    with zero_infinity), and frame counts vary per call: one export."""
    g = torch.Generator().manual_seed(2)
    batches = []
    for t, lengths, frames in ((9, (3, 2), (9, 7)), (12, (4, 4), (12, 10)), (7, (2, 5), (7, 3))):
        if not zero_infinity and min(f - n for f, n in zip(frames, lengths)) < 0:
            frames = (t, t)
        batches.append((torch.randn(2, t, 6, generator=g), torch.randint(1, 5, (2, 5), generator=g),
                        torch.tensor(frames), torch.tensor(lengths)))
    ours = _train_with_parity(lambda: WithCTC(reduction, zero_infinity), batches)
    assert ours.export_count == 1
    assert _aten_ops(ours) == {"torch_ort::ctc_loss.default"}
    assert F.ctc_loss is torch_ctc_loss  # the stock function again after the export


def _eager_experts(make):
    def build():
        model = make(layers=1)  # one layer: the loop's export grows with every layer
        model.config._experts_implementation = "eager"
        return model
    return build


@pytest.mark.parametrize("make", [_mixtral, _qwen2_moe], ids=["mixtral", "qwen2_moe"])
def test_moe_with_the_eager_experts_loop_trains_in_the_engine(strict, make):
    """transformers' eager experts: a Python loop over `nonzero()` experts, each picking its tokens
    with `torch.where` (data-dependent counts) and adding its output back with index_add_. The
    loop is exported with the number of experts hit taken from the call's values and checked on
    every call (a data-dependent decision); routing, gathers and scatters run on our kernels."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for t in (8, 11, 6):
        ids = torch.randint(0, 128, (2, t), generator=g)
        batches.append(dict(input_ids=ids, labels=ids))
    ours = _train_with_parity(_eager_experts(make), batches, loss_of=lambda out: out.loss)
    assert ours.module.config._experts_implementation == "eager"
    st = ours.stats()
    assert st["fallback"] is None and st["decisions"] >= 1
    assert st["exports"] == 1 + st["decision_flips"]  # one export per outcome of the decisions
    assert not any("grouped_mm" in op for op in st["aten_fallback_ops"])


class Experts(torch.nn.Module):
    """Rows sorted by expert through transformers' grouped_mm operator, as its MoE layers call it."""

    def __init__(self, experts=3, k=5, n=7):  # K, N of 5 and 7: rows of no 16-byte multiple
        super().__init__()
        self.proj = torch.nn.Linear(k, k)
        self.weight = torch.nn.Parameter(torch.randn(experts, k, n) / k)

    def forward(self, x, offs):
        y = torch.ops.transformers.grouped_mm_fallback(self.proj(x), self.weight, offs=offs)
        return (y * torch.arange(1, y.size(1) + 1)).pow(2).sum()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_grouped_matmul_matches_transformers_loop(strict, dtype):
    """Experts without rows (their weight gradient zero), rows past the last group (zero output, no
    gradient), a call where one expert takes every row; the values are transformers' own."""
    import transformers.integrations.moe  # noqa: F401  (registers the operator)
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(s, 5, generator=g), torch.tensor(offs, dtype=dtype))
               for s, offs in ((9, (2, 2, 9)), (12, (0, 7, 10)), (6, (0, 0, 6)), (8, (3, 5, 8)))]
    ours = _train_with_parity(Experts, batches)
    assert ours.export_count == 1 and _aten_ops(ours) == set()
    assert {"GroupedMatMul", "GroupedMatMulGrad"} <= {n.op_type for n in _training_graph(ours).node}


@pytest.mark.parametrize("offs,why", [((4, 2, 9), "non-decreasing"), ((2, 5, 11), "end rows within the 9 rows"),
                                      ((2, 9), "offs length 2 must match number of experts 3")])
def test_grouped_matmul_names_bad_offsets(strict, offs, why):
    """Offsets out of order or past the rows: the kernel's error; of the wrong length: the operator's
    own fake implementation refuses them while exporting."""
    import transformers.integrations.moe  # noqa: F401
    model = ORTModule(Experts())
    model(torch.randn(9, 5), torch.tensor((2, 5, 9), dtype=torch.int32)).backward()  # a good call first
    with pytest.raises(Exception, match=why):
        model(torch.randn(9, 5), torch.tensor(offs, dtype=torch.int32)).backward()
    weight = model.module.weight.detach().clone()
    model(torch.randn(9, 5), torch.tensor((2, 5, 9), dtype=torch.int32)).backward()  # still works after
    assert torch.equal(model.module.weight, weight)  # nothing of the user's changed
