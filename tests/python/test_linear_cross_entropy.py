"""The LM head fused with its loss (the linear_cross_entropy_fusion pass, LinearCrossEntropy): the
head's GEMMs, the loss and their gradients in chunks of rows, gradients made in forward. Parity
with eager over AdamW steps with label sparsity on and off (a product also returned is read row by
row), with the logits dropped (ORTMODULE_SKIP_LOGITS), on the AVX-512, AVX2 and ATen row paths, for
Llama, Qwen2 and GPT-2 (tied heads), T5 (an encoder-decoder head), Gemma 2 (soft-capped logits)
and a plain Linear + F.cross_entropy; the graph's structure; a frozen head; a batch
whose labels are all ignored; labels out of range."""
import contextlib
import copy
import os

import onnx
import pytest
import torch
import torch.nn.functional as F

import torch_ort
from torch_ort import DebugOptions, ORTModule

from test_label_sparsity import (VOCAB, Head, gpt2, llama, loss_of, qwen2, saved_graph, sft_batch,
                                 train_both)


def t5():
    from transformers import T5Config, T5ForConditionalGeneration
    # Gated GELU (T5 v1.1, Flan-T5): with ReLU a pre-activation within rounding of 0 can take
    # either side after a few AdamW steps, and its row's gradient with it, whatever the head does.
    cfg = T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                   dropout_rate=0.0, decoder_start_token_id=0, feed_forward_proj="gated-gelu")
    return T5ForConditionalGeneration(cfg)


def gemma2():
    from transformers import Gemma2Config, Gemma2ForCausalLM
    cfg = Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       final_logit_softcapping=30.0, attn_logit_softcapping=None)
    return Gemma2ForCausalLM(cfg)


def op_types(g):
    return [n.op_type for n in g.node]


CASES = {  # model, environment
    "llama_skip_logits": (llama, {"ORTMODULE_SKIP_LOGITS": "1"}),
    "qwen2_tied_every_row": (qwen2, {"ORTMODULE_ENABLE_SPARSE_OPTIMIZER": "0"}),
    "gpt2_tied_every_row_skip_logits": (gpt2, {"ORTMODULE_ENABLE_SPARSE_OPTIMIZER": "0",
                                               "ORTMODULE_SKIP_LOGITS": "1"}),
    "t5": (t5, {}),
    "gemma2_softcapped": (gemma2, {}),
    "gemma2_softcapped_skip_logits": (gemma2, {"ORTMODULE_SKIP_LOGITS": "1"}),
    "linear_smoothing_every_row": (lambda: Head(smoothing=0.1), {"ORTMODULE_ENABLE_SPARSE_OPTIMIZER": "0"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_trains_like_eager(name, monkeypatch):
    make, env = CASES[name]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    ours = train_both(make, skip_logits=env.get("ORTMODULE_SKIP_LOGITS") == "1")
    assert ours.stats()["fallback"] is None


@contextlib.contextmanager
def row_path(path):
    """The row loop on `path` ("avx512", "avx2" or "portable": the ATen ops); skips where the
    processor lacks it."""
    try:
        torch_ort._C.set_optim_cpu_path(path)
    except ValueError as e:
        pytest.skip(str(e))
    try:
        yield
    finally:
        torch_ort._C.set_optim_cpu_path("auto")


@pytest.mark.parametrize("path", ["portable", "avx2", "avx512"])
def test_each_row_path_trains_like_eager(path):
    with row_path(path):
        assert torch_ort._C.optim_cpu_path() == path
        train_both(lambda: Head(smoothing=0.05), steps=4)


def _fused_node(x, w, b, labels, smoothing, chunk_bytes=None):
    """One LinearCrossEntropy node (transB, ignore_index -100, mean) making the loss, dX, dW and
    dbias, as an engine over (x, w, b, labels); chunk_bytes: the kernel's default (one chunk here)."""
    from onnx import TensorProto, helper
    elem = {torch.float32: TensorProto.FLOAT, torch.bfloat16: TensorProto.BFLOAT16,
            torch.float16: TensorProto.FLOAT16}[x.dtype]
    node = helper.make_node("LinearCrossEntropy", ["x", "w", "b", "y"], ["loss", "dx", "dw", "db"],
                            domain="com.torch_ort", transB=1, ignore_index=-100, label_smoothing=smoothing,
                            **({} if chunk_bytes is None else dict(chunk_bytes=chunk_bytes)))
    graph = helper.make_graph(
        [node], "lce",
        [helper.make_tensor_value_info(name, elem, list(t.shape)) for name, t in (("x", x), ("w", w), ("b", b))]
        + [helper.make_tensor_value_info("y", TensorProto.INT64, list(labels.shape))],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])]
        + [helper.make_tensor_value_info(name, elem, list(t.shape)) for name, t in (("dx", x), ("dw", w), ("db", b))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.torch_ort", 1)],
                              ir_version=10)
    return torch_ort._C.Engine(model.SerializeToString(), False, [False] * 4)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("path", ["avx2", "avx512"])
def test_each_row_loop_matches_the_aten_rows(path, dtype, smoothing):
    """Each fused row loop against the ATen formulas on the same rows: the loss, and the gradient
    written over the logits (read through dX, dW and dbias), with an ignored row, a row length
    that is no multiple of 16, a logit far below the row's maximum (its exp is below the smallest
    normal float) and, without smoothing (which makes the loss inf), a -inf logit as a masked
    vocabulary gives."""
    torch.manual_seed(0)
    n, v, h = 6, 1000 + 13, 32
    x, w, b = torch.randn(n, h), torch.randn(v, h) * 0.5, torch.randn(v)
    b[41] = -300.0
    if smoothing == 0:
        b[40] = -float("inf")
    x, w, b = x.to(dtype), w.to(dtype), b.to(dtype)
    labels = torch.tensor([3, -100, v - 1, 0, 517, 12])
    results = []
    for p in ("portable", path):
        with row_path(p):
            results.append(_fused_node(x, w, b, labels, smoothing).forward([x, w, b, labels])[0])
    (loss_a, *grads_a), (loss_f, *grads_f) = results
    assert torch.isfinite(loss_f)
    torch.testing.assert_close(loss_f, loss_a, rtol=1e-5, atol=1e-6)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for ours, aten in zip(grads_f, grads_a):
        torch.testing.assert_close(ours, aten, **tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_aten_rows_on_cuda_match_eager(dtype):
    """On a GPU the chunks go through the ATen row path, its softmax made in place over each
    chunk: the loss and dX, dW, dbias against eager's cross_entropy on the device, over chunks
    of 3 rows with an ignored row and label smoothing."""
    torch.manual_seed(0)
    n, v, h = 8, 1000 + 13, 32
    x, w, b = torch.randn(n, h), torch.randn(v, h) * 0.5, torch.randn(v)
    x, w, b = (t.to("cuda", dtype).requires_grad_() for t in (x, w, b))
    labels = torch.tensor([3, -100, v - 1, 0, 517, 12, 7, 999], device="cuda")
    eager = F.cross_entropy(F.linear(x, w, b).float(), labels, ignore_index=-100, label_smoothing=0.1)
    eager.backward()
    node = _fused_node(x.detach(), w.detach(), b.detach(), labels, 0.1, chunk_bytes=3 * v * 4)
    loss, *grads = node.forward([x.detach(), w.detach(), b.detach(), labels])[0]
    assert loss.is_cuda
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(loss, eager.detach(), **tol)
    for ours, t in zip(grads, (x, w, b)):
        torch.testing.assert_close(ours, t.grad, **tol)


def test_the_fused_head_reads_the_gathered_rows(tmp_path, monkeypatch):
    """Label sparsity then the fusion: one LinearCrossEntropy over the gathered rows, no loss op of
    its own, and its gradients made in forward (backward only scales them). The rows are gathered
    as early as is exact: the final norm and the last layer's MLP, norms, residual adds and
    attention output projection run on them too; the layers before, on every row."""
    monkeypatch.setenv("ORTMODULE_SKIP_LOGITS", "1")
    g, _ = saved_graph(tmp_path, monkeypatch, make=llama)
    producer = {o: n for n in g.node for o in n.output}
    assert "SoftmaxCrossEntropyLoss" not in op_types(g)
    [fused] = [n for n in g.node if n.op_type == "LinearCrossEntropy"]
    # Its rows: the final norm's, computed on the gathered rows.
    [x] = [v for v in g.value_info if v.name == fused.input[0]]
    assert [d.dim_param.startswith("label_rows") or d.dim_value for d in x.type.tensor_type.shape.dim] == [True, 64]
    assert producer[fused.input[3]].op_type == "Gather"  # the valid labels
    assert fused.input[1] == "lm_head.weight"
    assert [o != "" for o in fused.output] == [True, True, True, False]  # loss, dX, dW, no bias
    backward = [n for n in g.node if set(n.input) & (set(fused.output[1:]) - {""})]
    assert {n.op_type for n in backward} == {"LossGradientScale"}
    rank = {v.name: len(v.type.tensor_type.shape.dim) for v in g.value_info}
    forward = g.node[:list(g.node).index(fused)]
    gemms = {w: n for n in forward for w in n.input if w.endswith("_proj.weight")}
    mlp = ("gate_proj", "up_proj", "down_proj")
    for layer, gathered in ((0, ()), (1, ("o_proj", *mlp))):
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj", *mlp):
            gemm = gemms[f"model.layers.{layer}.{'mlp' if proj in mlp else 'self_attn'}.{proj}.weight"]
            assert rank[gemm.input[0]] == (2 if proj in gathered else 3), (layer, proj)


def _vocabulary_wide(g, vocab):
    """The graph's values with a last dim of `vocab` (rows × V tensors), the weights left out."""
    shapes = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
              for v in (*g.value_info, *g.output, *g.input)}
    return sorted(name for name, dims in shapes.items()
                  if dims and dims[-1] == vocab and len(dims) >= 2 and "weight" not in name)


def test_no_vocabulary_wide_value_when_logits_are_dropped(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTMODULE_SKIP_LOGITS", "1")
    g, model = saved_graph(tmp_path, monkeypatch, make=llama)
    assert _vocabulary_wide(g, VOCAB) == []
    assert "FusedMatMul" not in [n.op_type for n in g.node if "lm_head.weight" in n.input]


def test_returned_logits_are_the_only_vocabulary_wide_values(tmp_path, monkeypatch):
    """Logits returned (the default): the product once, its incoming gradient; the loss's rows are
    copied out of it chunk by chunk, never as a second (rows, V) value."""
    g, _ = saved_graph(tmp_path, monkeypatch, make=llama)
    producer = {o: n for n in g.node for o in n.output}
    logits = {o.name for o in g.output} & set(_vocabulary_wide(g, VOCAB))
    incoming = {i.name for i in g.input if i.name.startswith("grad_")} & set(_vocabulary_wide(g, VOCAB))
    assert len(logits) == 1 and len(incoming) == 1
    for name in set(_vocabulary_wide(g, VOCAB)) - logits - incoming:  # views of those two only
        view = producer[name]
        assert view.op_type in ("Flatten", "Reshape") and view.input[0] in logits | incoming, name
    [fused] = [n for n in g.node if n.op_type == "LinearCrossEntropy"]
    assert fused.input[4] in logits


def test_a_frozen_head_gets_no_weight_gradient(tmp_path, monkeypatch):
    """The head's weight frozen (adapter fine-tuning): forward makes dX only."""
    def frozen():
        m = llama()
        m.lm_head.weight.requires_grad_(False)
        return m
    g, _ = saved_graph(tmp_path, monkeypatch, make=frozen)
    [fused] = [n for n in g.node if n.op_type == "LinearCrossEntropy"]
    assert fused.output[1] != "" and (len(fused.output) < 3 or fused.output[2] == "")
    train_both(frozen, steps=3)


@pytest.mark.parametrize("skip_logits", ["0", "1"])
def test_softcapped_logits_are_fused(tmp_path, monkeypatch, skip_logits):
    """Gemma 2's tanh soft-capping between the head and the loss goes into the op: with the capped
    logits returned the chunks are read from them, else from the op's own GEMM."""
    monkeypatch.setenv("ORTMODULE_SKIP_LOGITS", skip_logits)
    g, _ = saved_graph(tmp_path, monkeypatch, make=gemma2)
    assert "SoftmaxCrossEntropyLoss" not in op_types(g)
    if skip_logits == "1":
        assert "Tanh" not in op_types(g), "the capping is inside the op"
    [fused] = [n for n in g.node if n.op_type == "LinearCrossEntropy"]
    [cap] = [a.f for a in fused.attribute if a.name == "softcap"]
    assert cap == pytest.approx(30.0)
    assert (len(fused.input) > 4 and fused.input[4] != "") == (skip_logits == "0")


@pytest.mark.parametrize("path", ["avx512", "avx2", "portable"])
@pytest.mark.parametrize("sparsity", ["1", "0"])
def test_all_labels_ignored_behaves_as_eager(monkeypatch, sparsity, path):
    monkeypatch.setenv("ORTMODULE_ENABLE_SPARSE_OPTIMIZER", sparsity)
    with row_path(path):
        _all_ignored_like_eager()


def _all_ignored_like_eager():
    torch.manual_seed(0)
    eager = llama()
    ours = ORTModule(copy.deepcopy(eager))
    ids, _ = sft_batch(torch.Generator().manual_seed(3))
    labels = torch.full_like(ids, -100)
    results = []
    for model in (eager, ours):
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        results.append((out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_e, g_e), (loss_o, g_o) = results
    assert torch.isnan(loss_e) and torch.isnan(loss_o)
    for name in g_e:
        torch.testing.assert_close(g_o[name], g_e[name], msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("sparsity", ["1", "0"])
@pytest.mark.parametrize("label", [VOCAB, -3])
def test_a_label_out_of_range_raises(monkeypatch, sparsity, label):
    monkeypatch.setenv("ORTMODULE_ENABLE_SPARSE_OPTIMIZER", sparsity)
    model = ORTModule(Head(logits=False))
    ids, labels = sft_batch(torch.Generator().manual_seed(4))
    labels[1, -1] = label
    with pytest.raises(Exception, match=rf"label {label} at row \d+ is outside the {VOCAB} classes"):
        model(input_ids=ids, labels=labels)


def test_skip_logits_leaves_eval_and_label_free_calls_alone(monkeypatch):
    """Logits are dropped only where a loss is computed in training: eval mode and a call
    without labels return them."""
    monkeypatch.setenv("ORTMODULE_SKIP_LOGITS", "1")
    torch.manual_seed(0)
    model = ORTModule(llama())
    ids, labels = sft_batch(torch.Generator().manual_seed(5))
    out = model(input_ids=ids, labels=labels)
    assert out.logits is None and out.loss.requires_grad
    assert model(input_ids=ids).logits.shape == (*ids.shape, VOCAB)
    model.eval()
    with torch.no_grad():
        assert model(input_ids=ids, labels=labels).logits.shape == (*ids.shape, VOCAB)
