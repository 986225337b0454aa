"""ORTMODULE_USE_CUDA_GRAPH=1: steady-state steps replayed as CUDA graphs train exactly as the same
ORTModule without graphs — same losses, gradients, parameters and buffers over steps that include
gradient accumulation, optimizers updating parameters in place, dropout and a change of sequence
length — and stats() counts the captures and replays. Off by default. Skipped without a GPU.
Replays copy nothing out: outputs are the graph's buffers (a stale one raises when read) and .grad
is adopted from the backward graph's buffer (cuda_graph.py, "Replay buffers").

Both runs start from the same weights and see the same batches (and, with dropout, the same seeds
before every forward); a replay runs the kernels the uncaptured step runs, so the tolerances are
rounding-sized: two runs of some GPU kernels (attention backward) differ in their last bits even
without graphs — fp32 rtol 1e-4, bf16 torch's default (a bf16 ulp). The attention models step with
SGD: Adam would turn rounding-sized differences in gradients that are zero up to rounding (an
attention key bias) into whole steps of either sign."""
import pytest
import torch

from test_gpu_parity import MODELS, autocast, build, on_device
from torch_ort import ORTModule
from torch_ort.optim import FusedAdam

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TOL = {"fp32": dict(rtol=1e-4, atol=1e-5), "bf16": dict(rtol=1.6e-2, atol=1e-4)}
OPTIMIZERS = {  # each updates the parameters in place: a replay must read the new values
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01),
    "fused_adam": lambda p: FusedAdam(p, lr=1e-3, weight_decay=0.01),
}


def train(monkeypatch, graphs: bool, name: str, seqs: list, optimizer: str = "sgd", micro: int = 1,
          dropout: float = 0.0, precision: str = "fp32", set_to_none: bool = True) -> dict:
    """One ORTModule trained for len(seqs) optimizer steps (micro-batches of sequence length
    seqs[step]), CUDA graphs on or off; what it did, step by step."""
    monkeypatch.setenv("ORTMODULE_USE_CUDA_GRAPH", "1" if graphs else "0")  # read at construction
    _, batch, loss_of = MODELS[name]
    model = ORTModule(build(name, dropout))
    opt = OPTIMIZERS[optimizer](model.parameters())
    gen = torch.Generator().manual_seed(1)
    run = {"losses": [], "kept": [], "grads": [], "replays": [], "exports": []}
    for step, seq in enumerate(seqs):
        for m in range(micro):
            args, kwargs = on_device(*batch(gen, seq))
            if dropout:
                torch.manual_seed(1000 * step + m)  # the same masks in both runs
            with autocast(precision):
                loss = loss_of(model(*args, **kwargs))
            (loss / micro).backward()
            run["losses"].append(loss.item())
            run["kept"].append(loss.detach().clone())  # an output kept past the next call is cloned
        run["grads"].append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        run["replays"].append(model.stats()["cuda_graph_replays"])
        run["exports"].append(model.export_count)
    run["kept"] = [t.item() for t in run["kept"]]
    run["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    run["buffers"] = {n: b.clone() for n, b in model.named_buffers()}
    run["stats"] = model.stats()
    return run


def assert_same_training(captured: dict, plain: dict, precision: str = "fp32") -> None:
    tol = TOL[precision]
    torch.testing.assert_close(captured["losses"], plain["losses"], **tol, msg=lambda m: f"losses: {m}")
    assert captured["kept"] == captured["losses"], "a loss of an earlier step changed after later replays"
    for step, (g_c, g_p) in enumerate(zip(captured["grads"], plain["grads"])):
        assert g_c.keys() == g_p.keys(), f"step {step}: gradients for different parameters"
        for name in g_p:
            torch.testing.assert_close(g_c[name], g_p[name], **tol, msg=lambda m: f"step {step}, {name}.grad: {m}")
    for what in ("params", "buffers"):
        for name, v in plain[what].items():
            torch.testing.assert_close(captured[what][name], v, **tol, msg=lambda m: f"{name}: {m}")


def assert_replayed(run: dict, last: int = 3) -> None:
    """Captured at least once, and each of the last `last` optimizer steps replayed a graph."""
    assert run["stats"]["cuda_graph_captures"] >= 1, run["stats"]
    replays = run["replays"]
    assert all(b > a for a, b in zip(replays[-last - 1:], replays[-last:])), f"replays per step: {replays}"


def test_cuda_graphs_are_off_by_default(strict, monkeypatch):
    monkeypatch.delenv("ORTMODULE_USE_CUDA_GRAPH", raising=False)
    _, batch, loss_of = MODELS["mlp"]
    model = ORTModule(build("mlp"))
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        args, kwargs = on_device(*batch(gen))
        loss_of(model(*args, **kwargs)).backward()
    stats = model.stats()
    assert (stats["cuda_graph_captures"], stats["cuda_graph_replays"]) == (0, 0), stats


@pytest.mark.parametrize("name, optimizer, precision", [
    ("mlp", "adamw", "fp32"), ("mlp", "fused_adam", "bf16"), ("nanogpt", "sgd", "fp32"),
    ("nanogpt", "sgd", "bf16"), ("bert_cls", "sgd", "fp32"), ("cnn", "sgd", "fp32")])
def test_replayed_steps_train_like_uncaptured_ones(strict, monkeypatch, name, optimizer, precision):
    """10 steps of one shape; the CNN's BatchNorm also updates its running statistics in place."""
    plain = train(monkeypatch, False, name, [16] * 10, optimizer, precision=precision)
    captured = train(monkeypatch, True, name, [16] * 10, optimizer, precision=precision)
    assert_same_training(captured, plain, precision)
    assert_replayed(captured)
    assert plain["stats"]["cuda_graph_captures"] == 0


def test_a_model_with_aten_fallback_nodes_trains_the_same_and_says_whether_it_replays(
        strict, monkeypatch, torch_ort_log):
    """Hugging Face GPT-2's graph carries ATen fallback nodes (code the engine does not control):
    captured or not, training is unchanged, and a signature left uncaptured says why."""
    plain = train(monkeypatch, False, "gpt2", [16] * 8, "sgd")
    captured = train(monkeypatch, True, "gpt2", [16] * 8, "sgd")
    assert_same_training(captured, plain)
    if captured["stats"]["cuda_graph_replays"] == 0:
        assert any("runs without CUDA graphs" in r.getMessage() for r in torch_ort_log), \
            "no replay and no warning saying why"
    else:
        assert_replayed(captured)


def test_gradient_accumulation_under_cuda_graphs(strict, monkeypatch):
    """Three micro-batches per step: .grad sums the replays' gradients; steps compared before and
    after the optimizer."""
    plain = train(monkeypatch, False, "nanogpt", [16] * 6, "sgd", micro=3)
    captured = train(monkeypatch, True, "nanogpt", [16] * 6, "sgd", micro=3)
    assert_same_training(captured, plain)
    assert_replayed(captured)


def test_dropout_under_cuda_graphs(strict, monkeypatch):
    """A replay draws fresh masks from the generator's state at replay time, as the uncaptured
    step does: with the same seed before each forward, the same masks; across steps, new ones."""
    plain = train(monkeypatch, False, "nanogpt", [16] * 8, "sgd", dropout=0.1)
    captured = train(monkeypatch, True, "nanogpt", [16] * 8, "sgd", dropout=0.1)
    assert_same_training(captured, plain)  # a replay reusing its capture's masks would differ here
    assert_replayed(captured)


def test_sequence_length_change_under_cuda_graphs(strict, monkeypatch):
    """A new sequence length is not replayed on the old graph; going back to the first length
    replays again, and nothing re-exports."""
    seqs = [16] * 4 + [24] * 4 + [16] * 4
    plain = train(monkeypatch, False, "nanogpt", seqs, "sgd")
    captured = train(monkeypatch, True, "nanogpt", seqs, "sgd")
    assert_same_training(captured, plain)
    assert_replayed(captured)
    assert len(set(captured["exports"])) == 1, captured["exports"]


@pytest.mark.parametrize("micro", [1, 3])
def test_zero_grad_without_none_under_cuda_graphs(strict, monkeypatch, micro):
    """.grad kept (zeroed in place) across steps, with and without accumulation: it moves off the
    backward graph's buffer before the next replay, and steps match the uncaptured ones."""
    plain = train(monkeypatch, False, "nanogpt", [16] * 6, "adamw", micro=micro, set_to_none=False)
    captured = train(monkeypatch, True, "nanogpt", [16] * 6, "adamw", micro=micro, set_to_none=False)
    assert_same_training(captured, plain)
    assert_replayed(captured)


def _steady(monkeypatch, name="nanogpt"):
    """A captured ORTModule on the GPU, a batch maker and its loss, after warm-up and capture."""
    monkeypatch.setenv("ORTMODULE_USE_CUDA_GRAPH", "1")
    _, batch, loss_of = MODELS[name]
    model = ORTModule(build(name))
    gen = torch.Generator().manual_seed(3)

    def call():
        args, kwargs = on_device(*batch(gen, 64))  # the zoo's longest: logits of 96 KB
        return model(*args, **kwargs)
    for _ in range(4):
        loss_of(call()).backward()
        model.zero_grad(set_to_none=True)
    assert model.stats()["cuda_graph_replays"] >= 1
    return model, call, loss_of


def test_replays_copy_no_output_and_no_gradient(strict, monkeypatch):
    """A replayed forward+backward allocates (almost) nothing: no clone of the logits, no copy of
    a gradient into .grad. Before, a step allocated both (logits plus every parameter's size)."""
    model, call, loss_of = _steady(monkeypatch)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = call()
    loss_of(out).backward()
    torch.cuda.synchronize()
    grown = torch.cuda.max_memory_allocated() - before
    logits_bytes = out[0].numel() * out[0].element_size()
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert grown < min(logits_bytes, grad_bytes) // 2, (grown, logits_bytes, grad_bytes)
    addresses = [p.grad.data_ptr() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    loss_of(call()).backward()
    assert [p.grad.data_ptr() for p in model.parameters()] == addresses  # the graph's buffers


def test_a_stale_output_raises_and_a_kept_alias_stays_intact(strict, monkeypatch):
    model, call, loss_of = _steady(monkeypatch)
    out = call()
    loss = loss_of(out)
    loss.backward()
    value, alias = loss.item(), out[0].detach()  # alias: shares the logits' buffer
    replays = model.stats()["cuda_graph_replays"]
    loss_of(call()).backward()  # the alias is alive: runs uncaptured, leaves it as it was
    assert model.stats()["cuda_graph_replays"] == replays
    kept = alias.clone()
    del alias
    newer = call()  # replays again, and the first call's output objects are invalidated
    assert model.stats()["cuda_graph_replays"] == replays + 1
    with pytest.raises(RuntimeError, match="overwritten by a later replay"):
        out[0].sum()
    assert loss_of(newer).item() != value and kept.isfinite().all()
