"""Label sparsity (the label_sparsity pass): a cross-entropy loss with an ignore_index over an LM
head runs the head, the loss and their gradients on the rows whose label counts. Structure of the
graph after the pass; losses, gradients and parameters equal to eager over AdamW steps for causal
LMs of transformers (tied and untied heads), a plain Linear + F.cross_entropy head with label
smoothing and with a sum reduction; the logits still returned and still differentiable; a label
out of range; the switches that turn it off. (A batch whose labels are all ignored:
test_linear_cross_entropy.py, with the pass on and off.)"""
import copy
import os

import onnx
import pytest
import torch
import torch.nn.functional as F

from torch_ort import DebugOptions, ORTModule

VOCAB = 1536  # above the pass's threshold (an LM head: 1024 classes or more)
STEPS = 10


def qwen2(tied=True):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return Qwen2ForCausalLM(cfg)


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


class Head(torch.nn.Module):
    """An embedding, a GELU MLP and a Linear head with bias; its own cross-entropy."""

    def __init__(self, smoothing=0.0, reduction="mean", logits=True):
        super().__init__()
        self.logits = logits
        self.emb = torch.nn.Embedding(VOCAB, 32)
        self.mlp = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, VOCAB)
        self.smoothing, self.reduction = smoothing, reduction

    def forward(self, input_ids, labels):
        logits = self.head(F.gelu(self.mlp(self.emb(input_ids))))
        loss = F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), ignore_index=-100,
                               label_smoothing=self.smoothing, reduction=self.reduction)
        return (loss, logits) if self.logits else loss


def sft_batch(gen, batch=3, seq=24):
    """Token ids and labels as supervised fine-tuning makes them: a prompt and right padding
    ignored (-100), about 40 % of the positions counted."""
    ids = torch.randint(0, VOCAB, (batch, seq), generator=gen)
    labels = ids.clone()
    for row in range(batch):
        prompt = int(torch.randint(4, seq // 2, (1,), generator=gen))
        end = int(torch.randint(seq // 2 + 2, seq, (1,), generator=gen))
        labels[row, :prompt] = -100
        labels[row, end:] = -100
    return ids, labels


def loss_of(out):
    return out.loss if hasattr(out, "loss") else out if isinstance(out, torch.Tensor) else out[0]


def logits_of(out):
    return out.logits if hasattr(out, "logits") else None if isinstance(out, torch.Tensor) else out[1]


def assert_norm_close(ours, eager, where, tol=1e-4):
    """‖ours − eager‖ ≤ tol·‖eager‖: a gradient's rows are summed in another order when only the
    valid ones are gathered, so single elements near zero differ by rounding while the tensor
    agrees to tol."""
    assert ours.shape == eager.shape, where
    err, norm = (ours.double() - eager.double()).norm().item(), eager.double().norm().item()
    assert err <= tol * norm, f"{where}: ‖ours − eager‖ {err:.3g}, ‖eager‖ {norm:.3g}"


def train_both(make, steps=STEPS, extra=None, skip_logits=False):
    """Eager and ORTModule twins trained with AdamW on the same batches; per step the loss, the
    logits and the gradients. (Not the parameters element by element: GPT-2's key bias has a
    gradient that is zero up to rounding, which Adam turns into ±lr steps, with the pass or without.)"""
    torch.manual_seed(0)
    eager = make()
    ours = ORTModule(copy.deepcopy(eager))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager, ours)]
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        ids, labels = sft_batch(gen)
        grads = []
        for model, opt in zip((eager, ours), opts):
            opt.zero_grad()
            out = model(input_ids=ids, labels=labels)
            loss = loss_of(out) + (extra(logits_of(out)) if extra else 0)
            loss.backward()
            logits = logits_of(out)
            grads.append((loss.detach(), None if logits is None else logits.detach(),
                          {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
            opt.step()
        (loss_e, logits_e, g_e), (loss_o, logits_o, g_o) = grads
        torch.testing.assert_close(loss_o, loss_e, rtol=1e-5, atol=1e-6, msg=lambda m: f"step {step}: {m}")
        if skip_logits:  # ORTMODULE_SKIP_LOGITS: none returned, eager's are not compared
            assert logits_o is None and logits_e is not None
        elif logits_e is not None:
            # atol 3e-5: the loss rows sum in another order than eager's log-softmax (8 or 16
            # lanes), and Adam turns gradients that are zero up to rounding into ±lr steps, so
            # after a few steps a logit near 0 may differ by ~1.5e-5 (1 of 110,592 seen).
            torch.testing.assert_close(logits_o, logits_e, rtol=1e-4, atol=3e-5)
        assert g_o.keys() == g_e.keys()
        for name in g_e:
            assert_norm_close(g_o[name], g_e[name], f"step {step}, {name}.grad")
    return ours


MODELS = {"qwen2_tied": qwen2, "qwen2_untied": lambda: qwen2(tied=False), "llama": llama, "gpt2": gpt2,
          "linear": Head, "linear_smoothing": lambda: Head(smoothing=0.1),
          "linear_sum": lambda: Head(reduction="sum"), "linear_no_logits": lambda: Head(logits=False)}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_trains_like_eager(name):
    ours = train_both(MODELS[name])
    # The valid rows' count is data: one host read per step, no more.
    assert ours.stats()["host_reads_forward"] == 1, ours.stats()
    assert ours.stats()["label_sparsity"] is True
    assert 0.2 < ours.stats()["label_density"] < 0.9  # sft_batch counts about 40 % of the labels


def test_logits_returned_and_differentiated_like_eager():
    """A loss that also reads the logits: the full product's gradient flows as well."""
    train_both(qwen2, steps=3, extra=lambda logits: 1e-3 * logits.square().mean())


def saved_graph(tmp_path, monkeypatch, make=qwen2):
    monkeypatch.setenv("ORTMODULE_SAVE_ONNX_PATH", str(tmp_path))
    torch.manual_seed(0)
    model = ORTModule(make(), DebugOptions(save_onnx=True, onnx_prefix="m"))
    ids, labels = sft_batch(torch.Generator().manual_seed(0))
    loss_of(model(input_ids=ids, labels=labels)).backward()
    return onnx.load(os.path.join(tmp_path, "m_execution_model_training.onnx")).graph, model


def test_the_head_runs_on_gathered_rows(tmp_path, monkeypatch):
    # The pass alone: the fusion that follows it would take the loss in (test_linear_cross_entropy.py).
    monkeypatch.setenv("ORTMODULE_DISABLED_PASSES", "linear_cross_entropy_fusion")
    g, _ = saved_graph(tmp_path, monkeypatch)
    producer = {o: n for n in g.node for o in n.output}
    outputs = {o.name for o in g.output}
    [loss] = [n for n in g.node if n.op_type == "SoftmaxCrossEntropyLoss"]
    assert producer[loss.input[1]].op_type == "Gather"
    # The model returns its logits: one GEMM computes them, the loss reads their valid rows.
    scores = producer[loss.input[0]]
    assert scores.op_type == "ProductRows"
    assert scores.input[3] in outputs and producer[scores.input[3]].op_type == "FusedMatMul"
    assert producer[scores.input[4]].op_type == "LabelRows"
    rows = producer[scores.input[0]]
    assert rows.op_type == "Gather" and rows.input[1] == scores.input[4]
    forward = g.node[:[n.op_type for n in g.node].index("SoftmaxCrossEntropyLoss") + 1]
    head_gemms = [n for n in forward if n.op_type in ("FusedMatMul", "MatMul", "Gemm") and "lm_head.weight" in n.input]
    assert len(head_gemms) == 1, "no second GEMM over the head in the forward"
    # The backward's weight gradient of the head is a GEMM over the gathered rows.
    assert [n for n in g.node if n.op_type in ("FusedMatMul", "Gemm") and rows.output[0] in n.input]


def test_without_returned_logits_the_rows_are_gathered_as_early_as_is_exact(tmp_path, monkeypatch):
    """Nothing else reads the head's input: the valid rows are gathered right after the embedding
    (which reads every id), so the MLP and its GELU run on them too, not only the head."""
    monkeypatch.setenv("ORTMODULE_DISABLED_PASSES", "linear_cross_entropy_fusion")
    g, _ = saved_graph(tmp_path, monkeypatch, make=lambda: Head(logits=False))
    producer = {o: n for n in g.node for o in n.output}
    [loss] = [n for n in g.node if n.op_type == "SoftmaxCrossEntropyLoss"]
    scores = producer[loss.input[0]]
    assert scores.op_type == "FusedMatMul" and "head.weight" in scores.input
    assert not [n for n in g.node if n.op_type == "ProductRows"]
    [rows] = [n for n in g.node if n.op_type == "Gather" and n.input[0] in producer and
              producer[n.input[0]].op_type == "Flatten" and producer[n.input[1]].op_type == "LabelRows"]
    assert producer[producer[rows.input[0]].input[0]].op_type == "Embedding"
    forward = g.node[:list(g.node).index(loss)]
    [mlp] = [n for n in forward if "mlp.weight" in n.input and n.op_type in ("FusedMatMul", "MatMul")]
    assert mlp.input[0] == rows.output[0]


@pytest.mark.parametrize("variable", ["ORTMODULE_ENABLE_SPARSE_OPTIMIZER", "ORTMODULE_ENABLE_COMPUTE_OPTIMIZER"])
def test_switched_off(tmp_path, monkeypatch, variable):
    monkeypatch.setenv(variable, "0")
    g, model = saved_graph(tmp_path, monkeypatch)
    assert not [n for n in g.node if n.op_type == "LabelRows"]
    assert model.stats()["label_sparsity"] is False
    assert model.stats()["label_density"] is None


def test_a_small_classifier_is_left_alone(tmp_path, monkeypatch):
    """Few classes: the head is cheap, the pass does not fire."""
    monkeypatch.setenv("ORTMODULE_SAVE_ONNX_PATH", str(tmp_path))
    model = ORTModule(torch.nn.Linear(16, 10), DebugOptions(save_onnx=True, onnx_prefix="s"))
    F.cross_entropy(model(torch.randn(8, 16)), torch.tensor([0, 1, 2, -100, 4, 5, -100, 7])).backward()
    g = onnx.load(os.path.join(tmp_path, "s_execution_model_training.onnx")).graph
    assert not [n for n in g.node if n.op_type == "LabelRows"]


def test_a_label_out_of_range_raises():
    model = ORTModule(Head())
    ids, labels = sft_batch(torch.Generator().manual_seed(4))
    labels[0, -1] = VOCAB + 7
    with pytest.raises(Exception, match=rf"label {VOCAB + 7} at row \d+ is outside the {VOCAB} classes"):
        model(input_ids=ids, labels=labels)


def test_no_gemm_reads_a_full_vocabulary_wide_tensor():
    """The returned logits are computed once; their gradient, absent (nobody differentiates them),
    runs no GEMM, and the head's backward multiplies only the valid rows: no mm or addmm of the
    step reads an (N, V) operand (N = every position)."""
    torch.manual_seed(0)
    model = ORTModule(Head())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids, labels = sft_batch(torch.Generator().manual_seed(5))
    n = ids.numel()
    assert (labels != -100).sum() < n
    for step in range(2):
        with torch.profiler.profile(record_shapes=True) as prof:
            opt.zero_grad()
            loss, logits = model(input_ids=ids, labels=labels)
            loss.backward()
            opt.step()
    assert logits.shape == (*ids.shape, VOCAB)
    gemms = [(e.name, e.input_shapes) for e in prof.events() if e.name in ("aten::mm", "aten::addmm")]
    assert gemms, "the profiler saw the step's GEMMs"
    # The operands only: a product written into a given buffer (out=) lists that buffer last.
    operands = {"aten::mm": 2, "aten::addmm": 3}
    full = [g for g in gemms if any(list(s) in ([n, VOCAB], [VOCAB, n]) for s in g[1][:operands[g[0]]])]
    assert not full, full
