"""Backward parity for every op-table row whose op has a gradient rule: the engine's training
graph (forward + our gradient rule) against torch.autograd on the row's eager reference."""
import pytest
import torch

from op_table import ALL_CASES, TOL, as_tuple, single_node_model
from torch_ort import _C

DIFFERENTIABLE = set(_C.differentiable_ops())
GRAD_CASES = [c for c in ALL_CASES if f"{c.domain}::{c.op}" in DIFFERENTIABLE and c.check_grad]
# Differentiable ops a single-node model cannot drive, and where their gradients are checked.
NO_GRADIENT_ROW = {"com.torch_ort::PythonOp": "the Function's own backward: test_python_op.py"}


def test_every_differentiable_op_has_a_gradient_row():
    """A gradient rule is checked against torch.autograd before it ships: one parity row suffices."""
    covered = {f"{c.domain}::{c.op}" for c in GRAD_CASES} | set(NO_GRADIENT_ROW)
    missing = sorted(DIFFERENTIABLE - covered)
    assert not missing, f"gradient rules without a parity row (op_table) checking backward: {missing}"


def _trainable(case, i, t):
    return t is not None and t.is_floating_point() and i not in case.consts


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.id for c in GRAD_CASES])
def test_gradient_matches_autograd(case):
    fed = [i for i, t in enumerate(case.inputs) if t is not None and i not in case.consts]
    probe_outs = as_tuple(case.ref(*[t for t in case.inputs if t is not None]))
    model, feeds = single_node_model(case, [e.detach() for e in probe_outs])
    engine = _C.Engine(model, True, [_trainable(case, i, case.inputs[i]) for i in fed])
    # Inputs the rule differentiates (declared non-differentiable ones, e.g. Pow's exponent, are
    # not), and the reference takes gradients for exactly those.
    wrt = [i for i, ok in zip(fed, engine.input_grad_available) if ok]
    if not wrt:
        assert not any(o.is_floating_point() for o in probe_outs), f"{case.id}: float output but no gradient"
        return
    ins = [t.detach().clone().requires_grad_() if i in wrt else t for i, t in enumerate(case.inputs)]
    if case.seed is not None:
        torch.manual_seed(case.seed)
    expected = as_tuple(case.ref(*[t for t in ins if t is not None]))
    if case.seed is not None:
        torch.manual_seed(case.seed)
    outs, ctx = engine.forward(feeds)
    gen = torch.Generator().manual_seed(1)
    # Gradients flow into the outputs both sides differentiate (torch declares some outputs
    # non-differentiable, e.g. native_layer_norm's mean/rstd; the C++ numeric checks cover ours).
    grads_out = [torch.randn(o.shape, generator=gen, dtype=o.dtype) if diff and e.requires_grad else None
                 for o, diff, e in zip(outs, engine.output_differentiable, expected)]
    got = dict(zip(fed, engine.backward(ctx, grads_out)))
    pairs = [(e, g) for e, g in zip(expected, grads_out) if g is not None and e.requires_grad]
    want = torch.autograd.grad([e for e, _ in pairs], [ins[i] for i in wrt], [g for _, g in pairs],
                               allow_unused=True)
    for i, w in zip(wrt, want):
        w = torch.zeros_like(ins[i]) if w is None else w
        torch.testing.assert_close(got[i], w, **TOL.get(w.dtype, {}), msg=lambda m: f"{case.id} input {i}: {m}")
