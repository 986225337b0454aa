"""Partial acceleration: a model that cannot run in the engine as a whole runs its largest
submodules that can in the engine and the rest eagerly — with its one data-dependent branch at the
top, inside the loop of blocks, at the bottom or in its own forward — at parity with eager PyTorch
(losses, gradients, parameters over several steps); one warning names the split and
ORTModule.fallback reports it; the module tree outside a call, state_dict keys and hooks are the
user's; a Hugging Face GPT-2 keeps its base model in the engine; ORTMODULE_PARTIAL_ACCELERATION=0
keeps the whole module eager; FALLBACK_DISABLE raises.
Each test allows only the failure kind it provokes, so any other engine failure raises."""
import copy
import warnings

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import model_zoo
from torch_ort import ORTModule, ORTModuleFallbackWarning, SubmoduleStatus
from torch_ort.ortmodule import ORTModuleTorchModelException

pytestmark = [pytest.mark.fallback, pytest.mark.branches_unexportable]
TORCH_MODEL = "FALLBACK_UNSUPPORTED_TORCH_MODEL"
ENGINE_BLOCKS = [(f"h.{i}", "engine") for i in range(4)]
SPLITS = {
    "top": ENGINE_BLOCKS + [("rescale", "eager")],
    "loop": [("h.0", "engine"), ("h.1", "split"), ("h.1.attn", "engine"), ("h.1.mlp", "engine"),
             ("h.2", "engine"), ("h.3", "engine")],
    "bottom": ENGINE_BLOCKS + [("rescale", "eager")],
    "root": ENGINE_BLOCKS,
}


@pytest.fixture(autouse=True)
def only_torch_model_failures(monkeypatch):
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", TORCH_MODEL)


def batches(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [model_zoo.nanogpt_batch(4, 16, gen)[0] for _ in range(n)]


STEPS = batches(2) * 3  # six steps over two batches: the loss falls within them


def twins(where):
    torch.manual_seed(0)
    eager = model_zoo.BranchyGPT(where)
    return eager, ORTModule(copy.deepcopy(eager))


def train(model, data):
    # SGD: Adam would turn float rounding in a gradient that is zero in exact arithmetic
    # (attention's key bias) into steps of lr, and compare noise
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    losses, first_grads = [], None
    for idx, targets in data:
        opt.zero_grad(set_to_none=True)
        loss = model(idx, targets)
        loss.backward()
        if first_grads is None:
            first_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    return losses, first_grads


def split_of(ours):
    return [(s.name, s.runs) for s in ours.fallback.submodules]


def assert_same_parameters(a, b, rtol=1e-5, atol=1e-6):
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    for name in pa:
        torch.testing.assert_close(pa[name], pb[name], rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("where", sorted(SPLITS))
def test_split_trains_at_parity_with_eager(where):
    eager, ours = twins(where)
    data = STEPS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ORTModuleFallbackWarning)
        ours_losses, ours_grads = train(ours, data)
    eager_losses, eager_grads = train(eager, data)
    assert split_of(ours) == SPLITS[where]
    assert ours.fallback.flag == TORCH_MODEL and ours.fallback.error_type == "ORTModuleTorchModelException"
    torch.testing.assert_close(torch.tensor(ours_losses), torch.tensor(eager_losses), rtol=1e-5, atol=0)
    assert ours_grads.keys() == eager_grads.keys()
    for name in eager_grads:
        torch.testing.assert_close(ours_grads[name], eager_grads[name], rtol=1e-4, atol=1e-6,
                                   msg=lambda m: f"{name}: {m}")
    assert_same_parameters(ours, eager)
    assert eager_losses[-1] < eager_losses[0]
    # over six steps: block 0 exported once, and the blocks identical to it used its graph
    exports = {e.name: e.wrapper.export_count for e in ours._split.entries}
    assert exports["h.0"] == 1 and exports["h.2"] == exports["h.3"] == 0, exports


@pytest.mark.parametrize("where", sorted(SPLITS))
def test_the_branch_is_taken_both_ways(monkeypatch, where):
    """The parity above covers both sides of the branch: the limit is crossed on some steps and
    not on others (else the model would be static and prove nothing about the split)."""
    taken, original = [], model_zoo._rescaled
    monkeypatch.setattr(model_zoo, "_rescaled",
                        lambda x, limit: taken.append(bool(x.abs().amax() > limit)) or original(x, limit))
    eager, _ = twins(where)
    train(eager, STEPS)
    assert True in taken and False in taken, taken


def _share(module, engine_modules):
    """The share of `module`'s parameter elements inside `engine_modules`, counted by hand."""
    inside = {id(p): p.numel() for m in engine_modules for p in m.parameters()}
    return sum(inside.values()) / sum(p.numel() for p in module.parameters())


def test_one_warning_names_the_split():
    _, ours = twins("loop")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for idx, targets in batches(3):
            ours(idx, targets).backward()
    mine = [w for w in caught if "torch_ort" in str(w.message)]
    assert len(mine) == 1 and mine[0].category is ORTModuleFallbackWarning, [str(w.message) for w in mine]
    text = str(mine[0].message)
    assert TORCH_MODEL in text and "ORTMODULE_PARTIAL_ACCELERATION=0" in text
    inner = ours.module
    engine = [inner.h[0], inner.h[1].attn, inner.h[1].mlp, inner.h[2], inner.h[3]]
    share = _share(inner, engine)
    assert 0 < share < 1 and ours.fallback.engine_parameter_share == pytest.approx(share)
    flops = ours.fallback.engine_flop_share
    assert 0.5 < flops < 1  # its value against eager's count: test_most_flops_run_in_the_engine
    assert (f"in the engine: h.0, h.1.attn, h.1.mlp, h.2-3 ({share:.0%} of the parameters, {flops:.0%} of the "
            "forward's FLOPs)") in text, text
    assert "h.1 runs its submodules where they can (ORTModuleTorchModelException" in text, text


def test_status_is_frozen_and_in_stats():
    _, ours = twins("bottom")
    with pytest.warns(ORTModuleFallbackWarning):
        ours(*batches(1)[0])
    status = ours.fallback
    assert status == ours.stats()["fallback"]
    assert status.engine_submodules == ("h.0", "h.1", "h.2", "h.3")
    assert status.engine_parameter_share == pytest.approx(_share(ours.module, list(ours.module.h)))
    eager = status.submodules[-1]
    assert isinstance(eager, SubmoduleStatus) and eager.name == "rescale" and eager.runs == "eager"
    assert eager.error_type == "ORTModuleTorchModelException" and "Rescale" in eager.reason
    with pytest.raises(Exception):
        eager.runs = "engine"  # frozen


class Unreached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
        self.spare = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))

    def forward(self, x):
        h = self.used(x)
        return h.mean() if h.sum() > 0 else h.pow(2).mean()


def test_submodules_not_reached_yet_are_reported_so():
    """A submodule no call has reached is neither in the engine nor eager yet."""
    ours = ORTModule(Unreached())
    with pytest.warns(ORTModuleFallbackWarning, match="not called yet: spare"):
        ours(torch.randn(3, 4))
    assert split_of(ours) == [("used", "engine"), ("spare", "not called")]


def test_all_or_nothing_keeps_the_whole_module_eager(monkeypatch):
    monkeypatch.setenv("ORTMODULE_PARTIAL_ACCELERATION", "0")
    eager, ours = twins("loop")
    data = batches(2)
    with pytest.warns(ORTModuleFallbackWarning, match="falling back to eager PyTorch") as caught:
        ours_losses, _ = train(ours, data)
    assert "ORTMODULE_PARTIAL_ACCELERATION" not in str(caught[0].message)
    assert ours._split is None and ours.fallback.submodules == ()
    assert ours_losses == train(eager, data)[0]  # eager, bit for bit


def test_fallback_disable_raises_and_splits_nothing(monkeypatch):
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", f"FALLBACK_DISABLE|{TORCH_MODEL}")
    _, ours = twins("loop")
    with pytest.raises(ORTModuleTorchModelException):
        ours(*batches(1)[0])
    assert ours._split is None and ours.fallback is None


def test_the_module_tree_is_the_users_outside_calls():
    """Submodules run through ORTModules only while the forward runs: afterwards the tree, the
    state_dict keys and the parameter names are the original's, and a state_dict round-trips."""
    eager, ours = twins("loop")
    blocks = list(ours.module.h)
    with pytest.warns(ORTModuleFallbackWarning):
        train(ours, batches(2))
    assert list(ours.module.h) == blocks and type(ours.module.h[1]) is model_zoo.BranchyBlock
    assert not any(isinstance(m, ORTModule) for m in ours.module.modules())
    assert list(ours.state_dict()) == list(eager.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in eager.named_parameters()]
    eager.load_state_dict(ours.state_dict())
    idx, targets = batches(1, seed=5)[0]
    torch.testing.assert_close(ours(idx, targets), eager(idx, targets), rtol=1e-5, atol=0)


def test_forward_hooks_on_submodules_run_as_in_eager():
    """A forward hook that changes a block's output, on a block that runs in the engine and on
    one that splits, and a pre-hook on the model: the results are eager's."""
    eager, ours = twins("loop")

    def scale(module, inputs, output):
        return output * 1.5

    def shift(module, args):
        return (args[0].flip(0), args[1].flip(0))

    for model in (eager, ours.module):
        model.h[2].register_forward_hook(scale)
        model.h[1].register_forward_hook(scale)
        model.register_forward_pre_hook(shift)
    data = batches(3)
    with pytest.warns(ORTModuleFallbackWarning):
        ours_losses, _ = train(ours, data)
    assert split_of(ours) == SPLITS["loop"]
    torch.testing.assert_close(torch.tensor(ours_losses), torch.tensor(train(eager, data)[0]),
                               rtol=1e-5, atol=0)
    assert_same_parameters(ours, eager)


def test_a_copy_splits_again():
    eager, ours = twins("top")
    data = batches(3)
    with pytest.warns(ORTModuleFallbackWarning):
        ours(*data[0])
    clone = copy.deepcopy(ours)
    assert clone._split is None and clone.fallback is not None
    clone_losses, _ = train(clone, data)
    assert split_of(clone) == SPLITS["top"]
    torch.testing.assert_close(torch.tensor(clone_losses), torch.tensor(train(eager, data)[0]),
                               rtol=1e-5, atol=0)


class Outer(torch.nn.Module):
    """Blocks the engine takes, around a step it cannot: a complex input, or an op with neither a
    kernel of ours nor the ATen fallback (pixel_shuffle's DepthToSpace, with ORTMODULE_ATEN_FALLBACK=0)."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8)) for _ in range(2))

    def forward(self, z):
        x = z.real + z.imag if z.is_complex() else \
            torch.nn.functional.pixel_shuffle(z.reshape(-1, 4, 1, 2), 2).reshape(z.shape)
        for b in self.blocks:
            x = b(x)
        return x.pow(2).mean()


@pytest.mark.parametrize("flag, dtype, env", [
    ("FALLBACK_UNSUPPORTED_DATA", torch.cfloat, {}),
    ("FALLBACK_UNSUPPORTED_ONNX_MODEL", torch.float32, {"ORTMODULE_ATEN_FALLBACK": "0"}),
])
def test_the_other_failure_kinds_split_too(monkeypatch, flag, dtype, env):
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", flag)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    torch.manual_seed(0)
    eager = Outer()
    ours = ORTModule(copy.deepcopy(eager))
    z = torch.randn(4, 8, dtype=dtype)
    with pytest.warns(ORTModuleFallbackWarning, match=flag):
        ours(z).backward()
    eager(z).backward()
    assert split_of(ours) == [("blocks.0", "engine"), ("blocks.1", "engine")]
    for (name, a), b in zip(ours.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7, msg=name)


class Scaled(torch.nn.Module):
    """A block whose forward reads a plain attribute that its repr does not show."""

    def __init__(self, scale: float):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.scale = scale

    def forward(self, x):
        return torch.tanh(self.fc(x)) * self.scale


def mlp(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 8))


class Blocks(torch.nn.Module):
    """A loop over blocks, then a data-dependent branch: the blocks run through the engine."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.mean() if x.sum() > 0 else x.pow(2).mean()


@pytest.mark.parametrize("blocks, exports", [
    (lambda: [mlp(16), mlp(16), mlp(32), mlp(16)], [1, 0, 1, 0]),  # another width: another export
    (lambda: [Scaled(1.0), Scaled(1.0), Scaled(-2.0)], [1, 0, 1]),  # same repr, another attribute: another
], ids=["widths", "plain attribute"])
def test_identical_submodules_share_one_export_and_others_do_not(blocks, exports):
    torch.manual_seed(0)
    eager = Blocks(blocks())
    ours = ORTModule(copy.deepcopy(eager))
    x = torch.randn(5, 8)
    with pytest.warns(ORTModuleFallbackWarning):
        ours(x).backward()
    eager(x).backward()
    assert [e.wrapper.export_count for e in ours._split.entries] == exports
    for (name, a), b in zip(ours.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7, msg=name)
    with torch.no_grad():  # inference engines from the shared graphs
        torch.testing.assert_close(ours(x), eager(x), rtol=1e-5, atol=0)


def engine_flop_share(ours, eager, idx, targets) -> float:
    """The share of a training step's FLOPs (forward and backward, as FlopCounterMode counts them
    in eager PyTorch) spent in the submodules that run in the engine."""
    counter = FlopCounterMode(display=False)
    with counter:
        eager(idx, targets).backward()
    eager.zero_grad(set_to_none=True)
    per_module = counter.get_flop_counts()
    root = type(eager).__name__
    total = sum(per_module["Global"].values())
    inside = sum(sum(per_module[f"{root}.{name}"].values()) for name in ours.fallback.engine_submodules)
    return inside / total


@pytest.mark.parametrize("where", sorted(SPLITS))
def test_most_flops_run_in_the_engine(where):
    eager, ours = twins(where)
    idx, targets = batches(1)[0]
    with pytest.warns(ORTModuleFallbackWarning):
        ours(idx, targets).backward()
    share = engine_flop_share(ours, eager, idx, targets)
    print(f"{where}: {share:.1%} of the step's FLOPs in the engine")
    assert 0.5 < share < 1.0
    # What the split reports: its first call's forward FLOPs, the engine's counted through the
    # dispatcher, against the eager twin's forward counted per module.
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        eager(idx, targets)
    per_module, root = counter.get_flop_counts(), type(eager).__name__
    forward = sum(sum(per_module[f"{root}.{name}"].values()) for name in ours.fallback.engine_submodules)
    assert ours.fallback.engine_flop_share == pytest.approx(forward / sum(per_module["Global"].values()), rel=0.02)
    assert f"{ours.fallback.engine_flop_share:.0%} of the forward's FLOPs" in ours._split.describe()


def test_a_hugging_face_model_keeps_its_base_model_in_the_engine():
    """GPT2LMHeadModel behind a forward pre-hook that branches on the batch: the whole model cannot
    be captured, its GPT2Model (every block, the embeddings, the final norm) runs in the engine and
    the tied lm_head eagerly; losses and gradients are eager's."""
    torch.manual_seed(0)
    eager = model_zoo.gpt2()

    def gate(module, args, kwargs):
        return (args, dict(kwargs)) if kwargs["input_ids"].sum() % 2 == 0 else (args, kwargs)

    eager.register_forward_pre_hook(gate, with_kwargs=True)
    ours = ORTModule(copy.deepcopy(eager))
    gen = torch.Generator().manual_seed(0)
    with pytest.warns(ORTModuleFallbackWarning, match="in the engine: transformer"):
        for _ in range(2):
            kw = model_zoo.lm_batch(4, 16, gen)[1]
            ours_loss, eager_loss = ours(**kw).loss, eager(**kw).loss
            ours_loss.backward()
            eager_loss.backward()
            torch.testing.assert_close(ours_loss, eager_loss, rtol=1e-5, atol=0)
    assert split_of(ours) == [("transformer", "engine")]
    for (name, a), b in zip(ours.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


@torch.library.custom_op("torch_ort_test::opaque_routing", mutates_args=())
def opaque_routing(index: torch.Tensor) -> torch.Tensor:
    """No fake implementation: torch.export cannot trace a module that calls it."""
    return index.clone()


def test_mixtral_with_its_experts_eager_keeps_the_rest_in_the_engine(monkeypatch):
    """Mixtral's experts made impossible to export: the split runs attention and the norms in the
    engine, and from the second call the LM head (a single layer, but half the forward's FLOPs
    here), while the router, whose outputs transformers' forward hooks record for the
    load-balancing loss (a context the model's eager forward sets), and the experts run eagerly.
    Traced into a graph, that hook would record the export's placeholder tensors into the loss
    (backward then failed inside torch). Losses and gradients are eager's; at least 90 % of the
    FLOPs outside the experts run in the engine."""
    import transformers
    from transformers.models.mixtral import modeling_mixtral

    experts_forward = modeling_mixtral.MixtralExperts.forward
    monkeypatch.setattr(modeling_mixtral.MixtralExperts, "forward",
                        lambda self, h, index, weights: experts_forward(self, h, opaque_routing(index), weights))
    cfg = transformers.MixtralConfig(vocab_size=1024, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.02)
    torch.manual_seed(0)
    eager = transformers.MixtralForCausalLM(cfg)
    ours = ORTModule(copy.deepcopy(eager))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, ours)]
    gen = torch.Generator().manual_seed(0)
    with pytest.warns(ORTModuleFallbackWarning):
        for t in (8, 11, 6):
            ids = torch.randint(0, 1024, (2, t), generator=gen)
            losses = []
            for model, opt in zip((eager, ours), opts):
                opt.zero_grad()
                out = model(input_ids=ids, labels=ids)
                assert out.aux_loss is not None
                out.loss.backward()
                losses.append(out.loss.detach())
            torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-6)
            for (name, a), b in zip(ours.named_parameters(), eager.parameters()):
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-5, msg=name)
            for opt in opts:
                opt.step()
    runs = dict(split_of(ours))
    for i in range(2):
        assert runs[f"model.layers.{i}.self_attn"] == "engine"
        assert runs[f"model.layers.{i}.mlp.gate"] == runs[f"model.layers.{i}.mlp.experts"] == "eager"
    assert runs["lm_head"] == "engine"
    reasons = {s.name: s.reason for s in ours.fallback.submodules}
    assert "record router_logits" in reasons["model.layers.0.mlp.gate"]
    # The forward's FLOPs outside the experts, counted per module on the eager twin.
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        eager(input_ids=ids, labels=ids)
    per_module, root = counter.get_flop_counts(), type(eager).__name__
    flops = lambda name: sum(per_module.get(f"{root}.{name}", {}).values())  # noqa: E731
    experts = sum(flops(f"model.layers.{i}.mlp.experts") for i in range(2))
    inside = sum(flops(name) for name in ours.fallback.engine_submodules)
    assert inside / (sum(per_module["Global"].values()) - experts) >= 0.9
