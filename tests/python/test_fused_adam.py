"""FusedAdam against plain references of its three rules (optim_reference.adam_step) and against
torch.optim, step by step, on both CPU kernel paths; checkpoints; bad input."""
import pytest
import torch

import torch_ort
from torch_ort.optim import AdamWMode, FusedAdam

from conftest import OPTIM_CPU_PATHS as PATHS
from optim_reference import adam_step

# 40000 > one 32768-element chunk; 37 and 5 leave SIMD tails.
SHAPES = [(40000,), (37,), (16, 16), (5,)]


def make_params(dtypes=(torch.float32,), seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtypes[i % len(dtypes)]))
            for i, s in enumerate(SHAPES)]


def clone_params(params):
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def random_grads(params, gen):
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)


GROUPS = [  # per-group hyper-parameters; the second group has no bias correction
    dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.05, bias_correction=True),
    dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.0, bias_correction=False),
]


def run_against_reference(mode, dtypes, steps=100):
    params = make_params(dtypes)
    ref = [p.detach().clone() for p in params]
    groups = [dict(GROUPS[0], params=params[:2]), dict(GROUPS[1], params=params[2:])]
    opt = FusedAdam(groups, adam_w_mode=mode)
    ms = [torch.zeros(p.shape) for p in ref]
    vs = [torch.zeros(p.shape) for p in ref]
    gen = torch.Generator().manual_seed(1)
    for step in range(1, steps + 1):
        random_grads(params, gen)
        opt.step()
        for i, (r, p) in enumerate(zip(ref, params)):
            h = GROUPS[0] if i < 2 else GROUPS[1]
            adam_step(r, p.grad, ms[i], vs[i], lr=h["lr"], beta1=h["betas"][0], beta2=h["betas"][1],
                      eps=h["eps"], weight_decay=h["weight_decay"], step=step,
                      bias_correction=h["bias_correction"], mode=int(mode))
    return params, ref, opt, ms, vs


@pytest.mark.parametrize("mode", list(AdamWMode))
def test_each_mode_matches_its_reference_over_100_steps(cpu_path, mode):
    params, ref, opt, ms, vs = run_against_reference(mode, (torch.float32,))
    for p, r, m, v in zip(params, ref, ms, vs):
        torch.testing.assert_close(p.detach(), r, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(opt.state[p]["exp_avg"], m, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(opt.state[p]["exp_avg_sq"], v, rtol=1e-6, atol=1e-7)
    assert [g["step"] for g in opt.param_groups] == [100, 100]


@pytest.mark.parametrize("dtypes", [(torch.float16,), (torch.bfloat16,), (torch.bfloat16, torch.float32)],
                         ids=["fp16", "bf16", "bf16+fp32"])
@pytest.mark.parametrize("mode", list(AdamWMode))
def test_low_precision_params_match_fp32_math_reference(cpu_path, mode, dtypes):
    params, ref, opt, _, _ = run_against_reference(mode, dtypes, steps=30)
    for p, r in zip(params, ref):
        assert p.dtype == r.dtype
        torch.testing.assert_close(p.detach().float(), r.float(), rtol=1e-6, atol=1e-7)
        assert opt.state[p]["exp_avg"].dtype == torch.float32  # moments stay fp32


def train_pair(make_ours, make_torch, steps=100, dtype=torch.float32):
    a = make_params((dtype,))
    b = clone_params(a)
    ours, theirs = make_ours(a), make_torch(b)
    gen = torch.Generator().manual_seed(2)
    for _ in range(steps):
        random_grads(a, gen)
        for pa, pb in zip(a, b):
            pb.grad = pa.grad.clone()
        ours.step()
        theirs.step()
    return a, b


def test_adamw_torch_mode_matches_torch_adamw(cpu_path):
    # Same rule; torch's kernel forms m with lerp, so the two round differently: rtol 1e-5.
    a, b = train_pair(lambda ps: FusedAdam(ps, lr=1e-2, weight_decay=0.1, eps=1e-8,
                                           adam_w_mode=AdamWMode.ADAMW_TORCH),
                      lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, eps=1e-8))
    for pa, pb in zip(a, b):
        torch.testing.assert_close(pa.detach(), pb.detach(), rtol=1e-5, atol=1e-5)


def test_defaults_are_torch_adamw_and_make_its_update(cpu_path):
    """FusedAdam(params, lr=...) is torch.optim.AdamW(params, lr=...): the same defaults (the
    ADAMW_TORCH rule, eps 1e-8, weight_decay 0.01) and the same update."""
    def hyper(opt):
        return {k: opt.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
    ps = make_params()
    assert hyper(FusedAdam(ps)) == hyper(torch.optim.AdamW(ps))
    assert FusedAdam(ps).defaults["adam_w_mode"] == AdamWMode.ADAMW_TORCH
    a, b = train_pair(lambda ps: FusedAdam(ps, lr=1e-2), lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    for pa, pb in zip(a, b):
        torch.testing.assert_close(pa.detach(), pb.detach(), rtol=1e-5, atol=1e-5)


def test_adam_l2_mode_matches_torch_adam_up_to_eps_placement(cpu_path):
    # torch adds eps to √v/√bc2, ORT's rule to √v, so ORT's eps weighs 1/√bc2 (up to 32×) more in
    # early steps. Against √v ~ 1 that is nothing; an element whose gradients are ~1e-6 moves
    # differently by up to a few % of one step (lr = 1e-2): rtol 1e-5, atol 1e-4.
    a, b = train_pair(lambda ps: FusedAdam(ps, lr=1e-2, weight_decay=0.1, eps=1e-8,
                                           adam_w_mode=AdamWMode.ADAM_L2_REGULARIZATION),
                      lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1, eps=1e-8))
    for pa, pb in zip(a, b):
        torch.testing.assert_close(pa.detach(), pb.detach(), rtol=1e-5, atol=1e-4)


def test_avx512_and_portable_paths_agree_bit_for_bit():
    if PATHS == ["portable"]:
        pytest.skip("this processor has no AVX-512: only the portable path exists")
    results = []
    for path in PATHS:
        torch_ort._C.set_optim_cpu_path(path)
        try:
            params, _, opt, _, _ = run_against_reference(AdamWMode.ADAMW_TORCH,
                                                         (torch.float32, torch.bfloat16, torch.float16), 10)
        finally:
            torch_ort._C.set_optim_cpu_path("auto")
        results.append([p.detach() for p in params] + [opt.state[p]["exp_avg_sq"] for p in params])
    for x, y in zip(*results):
        assert torch.equal(x, y)


def test_state_dict_round_trip_resumes_identically(tmp_path):
    def fresh(params):
        return FusedAdam([dict(GROUPS[0], params=params[:2]), dict(GROUPS[1], params=params[2:])],
                         adam_w_mode=AdamWMode.ADAMW_TORCH)
    a = make_params((torch.float32, torch.bfloat16))
    opt_a = fresh(a)
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        random_grads(a, gen)
        opt_a.step()
    torch.save({"params": [p.detach() for p in a], "opt": opt_a.state_dict()}, tmp_path / "ckpt.pt")

    saved = torch.load(tmp_path / "ckpt.pt")
    b = [torch.nn.Parameter(t.clone()) for t in saved["params"]]
    opt_b = fresh(b)
    opt_b.load_state_dict(saved["opt"])
    for p in b:  # the bf16 parameters' moments are loaded as fp32, not rounded to bf16
        assert opt_b.state[p]["exp_avg"].dtype == torch.float32
    assert [g["step"] for g in opt_b.param_groups] == [5, 5]
    for _ in range(5):
        random_grads(a, gen)
        for pa, pb in zip(a, b):
            pb.grad = pa.grad.clone()
        opt_a.step()
        opt_b.step()
    for pa, pb in zip(a, b):
        assert torch.equal(pa, pb)
        assert torch.equal(opt_a.state[pa]["exp_avg_sq"], opt_b.state[pb]["exp_avg_sq"])


def test_params_without_grad_are_left_alone_and_do_not_count_steps():
    a, b = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(4))
    opt = FusedAdam([{"params": [a]}, {"params": [b]}], lr=0.1)
    a.grad = torch.ones(4)
    opt.step()
    assert torch.equal(b.detach(), torch.ones(4)) and b not in opt.state
    assert opt.param_groups[0]["step"] == 1 and "step" not in opt.param_groups[1]


def test_noncontiguous_parameter_is_updated_in_place():
    base = torch.randn(8, 6)
    p = torch.nn.Parameter(base.t())  # a transposed view: not contiguous
    r = p.detach().clone()
    opt = FusedAdam([p], lr=1e-2, weight_decay=0.1, eps=1e-6, adam_w_mode=AdamWMode.ADAMW_TRANSFORMERS)
    m, v = torch.zeros(r.shape), torch.zeros(r.shape)
    for step in range(1, 4):
        p.grad = torch.randn(p.shape)
        opt.step()
        adam_step(r, p.grad, m, v, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.1,
                  step=step, bias_correction=True, mode=1)
    assert not p.is_contiguous()
    torch.testing.assert_close(p.detach(), r, rtol=1e-6, atol=1e-7)


def test_zero_grad_sets_none_unless_asked_not_to():
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    FusedAdam([p]).zero_grad()
    assert p.grad is None
    p.grad = torch.ones(3)
    FusedAdam([p], set_grad_none=False).zero_grad()
    assert torch.equal(p.grad, torch.zeros(3))


def test_sparse_gradient_raises_and_changes_nothing():
    emb = torch.nn.Embedding(10, 4, sparse=True)
    before = emb.weight.detach().clone()
    opt = FusedAdam(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse gradients"):
        opt.step()
    assert torch.equal(emb.weight.detach(), before) and not opt.state


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=-1.0), "learning rate"), (dict(betas=(1.0, 0.999)), "betas"),
    (dict(eps=-1.0), "eps"), (dict(weight_decay=-0.1), "weight_decay"),
    (dict(adam_w_mode=3), "AdamWMode"),
])
def test_bad_hyper_parameters_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FusedAdam([torch.nn.Parameter(torch.ones(2))], **kwargs)


def test_gradient_of_another_low_precision_dtype_is_a_type_error():
    p = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    p.grad_dtype = None  # torch refuses a gradient of another dtype unless told
    p.grad = torch.ones(4, dtype=torch.float16)
    with pytest.raises(TypeError, match="float16 gradient for a torch.bfloat16 parameter"):
        FusedAdam([p]).step()
    assert torch.equal(p.detach(), torch.ones(4, dtype=torch.bfloat16))
    # The kernel's own check runs before any tensor is touched: the fp32 tensor listed first is
    # left alone too.
    first = torch.ones(100000)
    with pytest.raises(TypeError, match=r"grads\[1\]: a Half gradient for a BFloat16 parameter"):
        torch_ort._C.multi_tensor_adam([first, p.detach()], [torch.ones(100000), p.grad],
                                       [torch.zeros(100000), torch.zeros(4)],
                                       [torch.zeros(100000), torch.zeros(4)], lr=0.1, beta1=0.9, beta2=0.9,
                                       eps=0.0, weight_decay=0.0, step=1, bias_correction=True, adam_w_mode=1)
    assert torch.equal(first, torch.ones(100000))


@pytest.mark.parametrize("lists, error, match", [
    (lambda: ([torch.ones(4)], [torch.ones(5)], [torch.zeros(4)], [torch.zeros(4)]), ValueError,
     r"grads\[0\] has 5 elements, params\[0\] has 4"),
    (lambda: ([torch.ones(4)], [torch.ones(4)], [torch.zeros(4)], []), ValueError, "exp_avg_sqs has 0 tensors"),
    (lambda: ([torch.ones(4)], [torch.ones(4)], [torch.zeros(4).half()], [torch.zeros(4)]), TypeError,
     r"exp_avgs\[0\] has dtype Half; expected float32"),
    (lambda: ([torch.ones(4, dtype=torch.int32)], [torch.ones(4)], [torch.zeros(4)], [torch.zeros(4)]),
     TypeError, "params\\[0\\] has dtype Int"),
    (lambda: ([torch.ones(4, 4).t()], [torch.ones(4, 4)], [torch.zeros(4, 4)], [torch.zeros(4, 4)]),
     ValueError, "params\\[0\\] is not contiguous"),
    (lambda: ([torch.ones(4, device="meta")], [torch.ones(4)], [torch.zeros(4)], [torch.zeros(4)]),
     TypeError, "params\\[0\\] is on meta, this kernel runs on CPU"),
], ids=["sizes", "count", "state-dtype", "param-dtype", "contiguity", "device"])
def test_kernel_rejects_bad_lists_naming_list_and_index(lists, error, match):
    with pytest.raises(error, match=match):
        torch_ort._C.multi_tensor_adam(*lists(), lr=0.1, beta1=0.9, beta2=0.9, eps=0.0, weight_decay=0.0,
                                       step=1, bias_correction=True, adam_w_mode=1)


def test_cuda_parameters_without_cuda_kernels_get_a_clear_error(monkeypatch):
    from torch_ort.optim import _kernels
    monkeypatch.setattr(_kernels, "_cuda", None)
    monkeypatch.setitem(__import__("sys").modules, "torch_ort._C_cuda", None)  # as if not built
    with pytest.raises(RuntimeError, match="no CUDA kernels in this build"):
        _kernels.backend(torch.device("cuda", 0))
    with pytest.raises(RuntimeError, match="no kernels for meta tensors"):
        _kernels.backend(torch.device("meta"))
