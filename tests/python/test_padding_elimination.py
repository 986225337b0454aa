"""Padding elimination (the padding_elimination pass, ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER=1):
the token-wise work of a transformer runs on the positions whose attention_mask is not 0 (or
whose label counts). Losses and gradients equal to eager over AdamW steps with right padding;
labels that count on padded positions; the structure of the graph after the pass; the graphs it
leaves alone (returned logits, the switch off); and the run-time check of the attention mask."""
import copy
import os

import onnx
import pytest
import torch
import torch.nn.functional as F

from torch_ort import DebugOptions, ORTModule
from test_label_sparsity import VOCAB, assert_norm_close, llama, qwen2

STEPS = 6


@pytest.fixture(autouse=True)
def padding_elimination(monkeypatch):
    monkeypatch.setenv("ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER", "1")
    monkeypatch.setenv("ORTMODULE_SKIP_LOGITS", "1")


def padded_batch(gen, batch=3, seq=24, labels_on_padding=False):
    """Supervised fine-tuning's batch: right padding (attention_mask 0) and a prompt, both
    ignored (-100) unless labels_on_padding, where every padded position keeps its label."""
    ids = torch.randint(0, VOCAB, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.long)
    labels = ids.clone()
    for row in range(batch):
        end = int(torch.randint(seq // 2, seq - 2, (1,), generator=gen))
        prompt = int(torch.randint(2, end - 2, (1,), generator=gen))
        mask[row, end:] = 0
        labels[row, :prompt] = -100
        if not labels_on_padding:
            labels[row, end:] = -100
    return ids, mask, labels


def train_both(make, steps=STEPS, **batch_args):
    torch.manual_seed(0)
    eager = make()
    ours = ORTModule(copy.deepcopy(eager))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager, ours)]
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        ids, mask, labels = padded_batch(gen, **batch_args)
        seen = []
        for model, opt in zip((eager, ours), opts):
            opt.zero_grad()
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            seen.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
            opt.step()
        (loss_e, g_e), (loss_o, g_o) = seen
        torch.testing.assert_close(loss_o, loss_e, rtol=1e-5, atol=1e-6, msg=lambda m: f"step {step}: {m}")
        assert g_o.keys() == g_e.keys()
        for name in g_e:
            assert_norm_close(g_o[name], g_e[name], f"step {step}, {name}.grad")
    return ours, mask


@pytest.mark.parametrize("make", [llama, qwen2], ids=["llama", "qwen2_tied"])
def test_trains_like_eager(make):
    ours, mask = train_both(make)
    st = ours.stats()
    assert st["padding_elimination"] is True and st["label_sparsity"] is True
    assert st["row_density"] == pytest.approx(mask.float().mean().item())  # the last batch's
    # The rows kept, the attention mask's check and the loss's valid labels: three host reads.
    assert st["host_reads_forward"] == 3, st


def test_labels_that_count_on_padded_positions_keep_their_rows():
    """Eager computes those positions' predictions from the padding tokens; so does the engine,
    which keeps every row whose label counts."""
    ours, mask = train_both(llama, steps=3, labels_on_padding=True)
    assert ours.stats()["padding_elimination"] is True
    assert ours.stats()["row_density"] > mask.float().mean().item()


def saved_graph(tmp_path, monkeypatch, make=llama):
    monkeypatch.setenv("ORTMODULE_SAVE_ONNX_PATH", str(tmp_path))
    torch.manual_seed(0)
    model = ORTModule(make(), DebugOptions(save_onnx=True, onnx_prefix="m"))
    ids, mask, labels = padded_batch(torch.Generator().manual_seed(0))
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    return onnx.load(os.path.join(tmp_path, "m_optimized_pre_grad_training.onnx")).graph, model, out


def test_the_layers_run_on_the_kept_rows(tmp_path, monkeypatch):
    g, _, _ = saved_graph(tmp_path, monkeypatch)
    producer = {o: n for n in g.node for o in n.output}
    [rows] = [n for n in g.node if n.op_type == "PaddingRows"]
    assert list(rows.input[:2]) == ["attention_mask", "input_ids"]
    assert producer[rows.input[2]].op_type != "PaddingRows"  # the loss's labels: their rows are kept
    [embedding] = [n for n in g.node if n.op_type == "Embedding"]
    ids = producer[embedding.input[1]]
    assert ids.op_type == "PackRows" and ids.input[0] == "input_ids"
    # Every projection of every layer (q, k, v, o, gate, up, down) reads packed rows; but for the
    # last layer's after attention, which label sparsity runs on the rows whose label counts.
    layer_gemms = [n for n in g.node if n.op_type in ("FusedMatMul", "MatMul") and "layers." in n.input[1]]
    assert len(layer_gemms) == 2 * 7
    for gemm in layer_gemms:
        last = gemm.input[1].startswith("model.layers.1.") and gemm.input[1].split(".")[-2] in (
            "o_proj", "gate_proj", "up_proj", "down_proj")
        assert gemm.input[0].endswith("/label_rows" if last else "/packed"), gemm
    # Padded back only where attention reads them (q, k, v per layer) and for the loss's gather
    # (of the residual entering the last layer; attention's output is read padded as it is).
    pads = [n for n in g.node if n.op_type == "PadRows"]
    assert len(pads) == 2 * 3 + 1
    [check] = [n for n in g.node if n.op_type == "PaddingMaskCheck"]
    for attention in (n for n in g.node if n.op_type == "Attention"):
        assert attention.input[3] == check.output[0]


def test_returned_logits_leave_the_graph_alone(monkeypatch):
    """The logits of padded positions are outputs: computing them from the padding as eager does
    needs every row."""
    monkeypatch.setenv("ORTMODULE_SKIP_LOGITS", "0")
    torch.manual_seed(0)
    eager = llama()
    ours = ORTModule(copy.deepcopy(eager))
    ids, mask, labels = padded_batch(torch.Generator().manual_seed(2))
    out_e, out_o = (m(input_ids=ids, attention_mask=mask, labels=labels) for m in (eager, ours))
    torch.testing.assert_close(out_o.logits, out_e.logits, rtol=1e-4, atol=1e-5)
    assert ours.stats()["padding_elimination"] is False and ours.stats()["row_density"] is None


def test_off_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER")
    g, model, _ = saved_graph(tmp_path, monkeypatch)
    assert not [n for n in g.node if n.op_type in ("PaddingRows", "PackRows", "PadRows")]
    assert model.stats()["padding_elimination"] is False


class OneHeadAttention(torch.nn.Module):
    """An embedding, one attention head over F.scaled_dot_product_attention and a head with
    F.cross_entropy. Its mask: `keys` hides padded keys (additive, finfo.min, (B, 1, 1, T)), as
    models do; `queries` hides padded queries instead, so a counted position attends the padding."""

    def __init__(self, mask="keys"):
        super().__init__()
        self.mask = mask
        self.emb = torch.nn.Embedding(VOCAB, 32)
        self.qkv = torch.nn.Linear(32, 96)
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, input_ids, attention_mask, labels):
        x = self.emb(input_ids)
        q, k, v = (t.unsqueeze(1) for t in self.qkv(x).chunk(3, dim=-1))
        if self.mask == "keys":
            keep = attention_mask[:, None, None, :].bool()
            bias = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
        else:
            bias = attention_mask[:, None, :, None].bool().expand(-1, 1, -1, input_ids.shape[1])
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).squeeze(1)
        logits = self.head(x + y)
        return F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), ignore_index=-100)


def test_a_model_of_its_own_with_a_key_padding_mask_trains_like_eager():
    torch.manual_seed(0)
    eager = OneHeadAttention()
    ours = ORTModule(copy.deepcopy(eager))
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        ids, mask, labels = padded_batch(gen)
        loss_e, loss_o = (m(input_ids=ids, attention_mask=mask, labels=labels) for m in (eager, ours))
        loss_e.backward()
        loss_o.backward()
        torch.testing.assert_close(loss_o, loss_e, rtol=1e-5, atol=1e-6)
        for (name, p), q in zip(eager.named_parameters(), ours.parameters()):
            assert_norm_close(q.grad, p.grad, name)
    assert ours.stats()["padding_elimination"] is True


@pytest.mark.parametrize("case", ["attends_padding", "sees_only_padding"])
def test_a_mask_that_lets_counted_rows_see_the_padding_is_refused(case):
    """`attends_padding`: the mask hides padded queries, not keys. `sees_only_padding`: a sequence
    that is all padding keeps labels that count; every key of those rows is at finfo.min, so
    softmax spreads their weight over every key, the dropped ones included."""
    model = ORTModule(OneHeadAttention("queries" if case == "attends_padding" else "keys"))
    ids, mask, labels = padded_batch(torch.Generator().manual_seed(3))
    if case == "sees_only_padding":
        mask[0] = 0
        labels[0] = -100
        labels[0, :3] = ids[0, :3]
    with pytest.raises(Exception, match="attention mask lets a position that counts attend a position whose "
                                        "attention_mask is 0"):
        model(input_ids=ids, attention_mask=mask, labels=labels)
