"""ORTModule on a CUDA GPU trains like eager PyTorch on the same GPU: the model zoo (Hugging Face
GPT-2, BERT masked LM and classifier, nanoGPT), the conftest MLP and regressor and a CNN with
BatchNorm, in fp32 and under bf16 autocast — outputs, gradients, losses over several steps,
buffers, then an eval forward; and under bf16 and fp16 autocast the loss has eager's dtype (fp32:
autocast runs losses in fp32) and value. Skipped without a GPU. The other test_gpu_* files share
this file's model table and helpers.

Tolerances: losses rtol 1e-4 (fp32) / 1e-2 (bf16). Outputs and gradients as norm-relative errors,
‖ours − eager‖ ≤ tol · max(‖eager‖, 1% of the set's largest norm), tol 1e-3 (fp32), 3e-2 (bf16),
1e-2 (fp16): on a GPU eager may pick other attention kernels than the engine (cuDNN or flash), so
elements round differently while the sums stay close; the floor keeps gradients that are zero up to
rounding (an attention key bias) from being divided by nothing. Under autocast a gradient that is
zero in exact arithmetic (the bias of a convolution that training-mode BatchNorm follows) is the
low precision's rounding noise in eager and in ours alike, so each tensor may also be off by the
precision's unit roundoff times the set's largest norm."""
import copy

import pytest
import torch

import model_zoo
from conftest import MLPClassifier, Regressor, classifier_batch, regression_batch
from test_autocast import ConvNet, grads_of
from torch_ort import ORTModule

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICE = "cuda"  # every helper below reads it: a dry run of this file's logic may set "cpu"

STEPS = 5
TOL = {"fp32": dict(loss=1e-4, out=1e-3, grad=1e-3), "bf16": dict(loss=1e-2, out=3e-2, grad=3e-2),
       "fp16": dict(loss=1e-3, out=1e-2, grad=1e-2)}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
ROUNDOFF = {"fp32": 0.0, "bf16": 2.0 ** -8, "fp16": 2.0 ** -11}  # unit roundoff of the compute dtype
# Loose enough for kernel rounding; a loss rounded to bf16 (near 11: off by anything up to 3e-3)
# is caught by its dtype, not its value.
AUTOCAST_LOSS_RTOL = {"bf16": 3e-3, "fp16": 1e-3}


def _zoo(name):
    factory, make_batch = model_zoo.ZOO[name]
    return (lambda dropout=0.0: factory(dropout=dropout), lambda gen, seq=16: make_batch(4, seq, gen),
            model_zoo.loss_of)


def _image_batch(gen, seq=None):
    return (torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 5, (4,), generator=gen)), {}


# name -> (factory(dropout=0.0), batch(gen, seq) -> (args, kwargs) on the CPU, loss_of(output))
MODELS = {name: _zoo(name) for name in model_zoo.ZOO}
MODELS.update({
    "mlp": (lambda dropout=0.0: MLPClassifier(), lambda gen, seq=None: (classifier_batch(8, gen=gen), {}),
            lambda out: out[0]),
    "regressor": (lambda dropout=0.0: Regressor(), lambda gen, seq=None: (regression_batch(8, gen=gen), {}),
                  lambda out: out[0]),
    "cnn": (lambda dropout=0.0: ConvNet(), _image_batch, lambda out: out[0]),
})


def on_device(args, kwargs):
    move = lambda v: v.to(DEVICE) if isinstance(v, torch.Tensor) else v  # noqa: E731
    return [move(a) for a in args], {k: move(v) for k, v in kwargs.items()}


def autocast(precision: str):
    return torch.autocast(DEVICE, dtype=DTYPES.get(precision, torch.bfloat16), enabled=precision != "fp32")


def build(name: str, dropout: float = 0.0) -> torch.nn.Module:
    """The model `name` on the GPU, from seed 0 (the same weights every time)."""
    torch.manual_seed(0)
    return MODELS[name][0](dropout=dropout).to(DEVICE)


def twins(name: str, dropout: float = 0.0):
    """An eager model on the GPU and an ORTModule around an identical copy."""
    eager = build(name, dropout)
    return eager, ORTModule(copy.deepcopy(eager))


def no_cache(model) -> dict:
    """{"use_cache": False} for a Hugging Face model that would return a key/value cache from an
    eval forward (GPT-2, T5): torch 2.11's exporter fails on a cache returned under no_grad
    (test_models.py pins that), and the cache is not what an eval forward is checked for."""
    config = getattr(model, "config", None)
    return {"use_cache": False} if getattr(config, "use_cache", False) else {}


def floats(out) -> dict:
    """The floating-point tensors of an output (a tuple or a ModelOutput), by position or key."""
    items = out.items() if hasattr(out, "items") else enumerate(out if isinstance(out, (tuple, list)) else [out])
    return {str(k): v.detach() for k, v in items if isinstance(v, torch.Tensor) and v.is_floating_point()}


def assert_rel_close(ours: dict, eager: dict, tol: float, where: str, roundoff: float = 0.0) -> None:
    """Same names, dtypes and shapes; each tensor within tol (norm-relative, with the floor above),
    plus roundoff times the largest norm (a value that is rounding noise in both)."""
    assert ours.keys() == eager.keys(), f"{where}: {sorted(ours)} vs {sorted(eager)}"
    norms = {k: e.double().norm().item() for k, e in eager.items()}
    largest = max(norms.values(), default=0.0)
    floor = 0.01 * largest
    for k, e in eager.items():
        o = ours[k]
        assert (o.dtype, o.shape) == (e.dtype, e.shape), \
            f"{where}, {k}: {o.dtype} {o.shape}, eager {e.dtype} {e.shape}"
        err = (o.double() - e.double()).norm().item()
        assert err <= tol * max(norms[k], floor) + roundoff * largest, \
            f"{where}, {k}: ‖ours − eager‖ {err:.3g}, ‖eager‖ {norms[k]:.3g} (tolerance {tol:g})"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_trains_like_eager_on_cuda(strict, name, precision):
    eager, ours = twins(name)
    _, batch, loss_of = MODELS[name]
    tol = TOL[precision]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01) for m in (eager, ours)]
    gen = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        args, kwargs = on_device(*batch(gen))
        results = []
        for model, opt in zip((eager, ours), opts):
            opt.zero_grad(set_to_none=True)
            with autocast(precision):
                out = model(*args, **kwargs)
            loss = loss_of(out)
            loss.backward()
            results.append((floats(out), loss.detach(), grads_of(model)))
            opt.step()
        (out_e, loss_e, grads_e), (out_o, loss_o, grads_o) = results
        assert loss_o.dtype == loss_e.dtype, f"step {step}"
        assert loss_o.item() == pytest.approx(loss_e.item(), rel=tol["loss"]), f"step {step}"
        if step == 0:
            assert_rel_close(out_o, out_e, tol["out"], "outputs, step 0", ROUNDOFF[precision])
            assert_rel_close(grads_o, grads_e, tol["grad"], "gradients, step 0", ROUNDOFF[precision])
            exports = ours.export_count  # the first step may take ATen-fallback rounds
    assert ours.export_count == exports, "a later step re-exported"
    buffers = lambda m: {n: b for n, b in m.named_buffers() if b.is_floating_point()}  # noqa: E731
    assert_rel_close(buffers(ours), buffers(eager), tol["grad"], "buffers (BatchNorm statistics)")
    for m in (eager, ours):
        m.eval()
    args, kwargs = on_device(*batch(gen))
    kwargs.update(no_cache(eager))
    with torch.no_grad(), autocast(precision):
        out_e, out_o = floats(eager(*args, **kwargs)), floats(ours(*args, **kwargs))
    assert_rel_close(out_o, out_e, tol["out"], "eval forward")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name", ["nanogpt", "gpt2", "bert_cls", "mlp", "regressor", "cnn"])
def test_autocast_loss_dtype_and_value_match_eager(strict, name, precision):
    """Eager autocast computes losses (cross_entropy, mse_loss) in fp32 even from bf16/fp16 logits;
    the engine's graph must too, not hand back a loss rounded to the low precision."""
    eager, ours = twins(name)
    _, batch, loss_of = MODELS[name]
    args, kwargs = on_device(*batch(torch.Generator().manual_seed(2)))
    results = []
    for model in (eager, ours):
        with autocast(precision):
            out = model(*args, **kwargs)
        loss = loss_of(out)
        loss.backward()
        results.append((floats(out), loss.detach(), grads_of(model)))
    (out_e, loss_e, grads_e), (out_o, loss_o, grads_o) = results
    assert loss_e.dtype == torch.float32
    assert loss_o.dtype == loss_e.dtype
    assert {k: v.dtype for k, v in out_o.items()} == {k: v.dtype for k, v in out_e.items()}
    assert loss_o.item() == pytest.approx(loss_e.item(), rel=AUTOCAST_LOSS_RTOL[precision])
    assert all(g.dtype == torch.float32 for g in grads_o.values())  # fp32 parameters, fp32 gradients
    assert_rel_close(grads_o, grads_e, TOL[precision]["grad"], f"gradients under {precision} autocast",
                     ROUNDOFF[precision])
