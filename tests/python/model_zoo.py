"""Small real models for model-level tests: Hugging Face GPT-2, BERT and T5 from tiny configs
(random init, nothing downloaded), a nanoGPT written by hand and a classifier taking its batch as
one nested dict; each comes with a batch maker."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, HEADS, LAYERS, POSITIONS = 96, 32, 4, 2, 64


def _quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()  # tiny configs trip harmless config warnings
    return transformers


def gpt2(dropout: float = 0.0, vocab: int = VOCAB, width: int = WIDTH, layers: int = LAYERS):
    """GPT2LMHeadModel: lm_head.weight IS transformer.wte.weight (tied)."""
    tf = _quiet_transformers()
    config = tf.GPT2Config(vocab_size=vocab, n_embd=width, n_head=HEADS, n_layer=layers,
                           n_positions=POSITIONS, resid_pdrop=dropout, embd_pdrop=dropout,
                           attn_pdrop=dropout, bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
    return tf.GPT2LMHeadModel(config)


def _bert_config(dropout: float):
    tf = _quiet_transformers()
    return tf.BertConfig(vocab_size=VOCAB, hidden_size=WIDTH, num_attention_heads=HEADS,
                         num_hidden_layers=LAYERS, intermediate_size=2 * WIDTH,
                         max_position_embeddings=POSITIONS, hidden_dropout_prob=dropout,
                         attention_probs_dropout_prob=dropout, pad_token_id=0, num_labels=3)


def bert_mlm(dropout: float = 0.0):
    return _quiet_transformers().BertForMaskedLM(_bert_config(dropout))


def bert_cls(dropout: float = 0.0):
    return _quiet_transformers().BertForSequenceClassification(_bert_config(dropout))


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, dropout)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * width, width), nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """nanoGPT (Karpathy) in miniature: tied wte/lm_head, F.scaled_dot_product_attention(is_causal)."""

    def __init__(self, vocab: int = VOCAB, width: int = WIDTH, heads: int = HEADS,
                 layers: int = LAYERS, positions: int = POSITIONS, dropout: float = 0.0):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(positions, width)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying: one parameter, two uses
        for module in self.modules():  # nanoGPT's init: N(0, 0.02), zero biases
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():  # residual projections scaled by depth
            if name.endswith("c_proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def nanogpt(dropout: float = 0.0):
    return NanoGPT(dropout=dropout)


def _rescaled(x: torch.Tensor, limit: float) -> torch.Tensor:
    """Halves `x` when its largest magnitude passes `limit`: Python control flow on a tensor's
    value, which no graph capture can take."""
    return x / 2 if x.abs().amax() > limit else x


class Rescale(nn.Module):
    def __init__(self, width: int, limit: float):
        super().__init__()
        self.proj, self.limit = nn.Linear(width, width), limit

    def forward(self, x):
        return _rescaled(x + self.proj(x), self.limit)


class BranchyBlock(Block):
    """A Block that rescales its residual stream between attention and MLP when it grows."""

    limit = 0.3

    def forward(self, x):
        x = _rescaled(x + self.attn(self.ln_1(x)), self.limit)
        return x + self.mlp(self.ln_2(x))


class BranchyGPT(NanoGPT):
    """nanoGPT with one data-dependent branch, placed by `where`: "top" (a Rescale module right after
    the embeddings), "loop" (block 1 of 4 branches inside), "bottom" (a Rescale module before the
    final norm) or "root" (in the model's own forward, between the blocks). Returns the loss."""

    def __init__(self, where: str, limit: float = 0.3, layers: int = 4, width: int = WIDTH,
                 heads: int = HEADS, **gpt):
        super().__init__(layers=layers, width=width, heads=heads, **gpt)
        self.where, self.limit = where, limit
        if where in ("top", "bottom"):
            self.rescale = Rescale(width, limit)
        if where == "loop":
            branchy = BranchyBlock(width, heads, 0.0)
            branchy.load_state_dict(self.h[1].state_dict())
            branchy.limit = limit
            self.h[1] = branchy

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        if self.where == "top":
            x = self.rescale(x)
        for i, block in enumerate(self.h):
            x = block(x)
            if self.where == "root" and i == 1:
                x = _rescaled(x, self.limit)
        if self.where == "bottom":
            x = self.rescale(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def t5(dropout: float = 0.0):
    """T5ForConditionalGeneration (encoder-decoder; relative position bias, a learned attention
    mask); labels make it shift them right into decoder inputs and compute the loss."""
    tf = _quiet_transformers()
    config = tf.T5Config(vocab_size=VOCAB, d_model=WIDTH, d_kv=WIDTH // HEADS, d_ff=2 * WIDTH,
                         num_layers=LAYERS, num_decoder_layers=LAYERS, num_heads=HEADS,
                         relative_attention_num_buckets=8, dropout_rate=dropout,
                         decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return tf.T5ForConditionalGeneration(config)


class DictBatchClassifier(nn.Module):
    """forward(self, batch, temperature=1.0) with batch = {"inputs": {"tokens", "features",
    "mask"}, "labels"}: one positional dict holding a nested dict, and a defaulted argument after
    it."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.project = nn.Linear(8, WIDTH)
        self.mix = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(2 * WIDTH, WIDTH))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, 3)
        nn.init.normal_(self.embed.weight, std=0.02)  # as language models do

    def forward(self, batch, temperature: float = 1.0):
        mask = batch["inputs"]["mask"].unsqueeze(-1).to(self.embed.weight.dtype)
        h = self.embed(batch["inputs"]["tokens"]) + self.project(batch["inputs"]["features"])
        h = self.norm(h + self.mix(h)) * mask
        logits = self.head(h[:, 0]) / temperature  # the class is in the first position
        return {"logits": logits, "loss": F.cross_entropy(logits, batch["labels"]),
                "mean": h.sum(1) / mask.sum(1).clamp(min=1.0)}


def dict_batch_classifier(dropout: float = 0.0):
    return DictBatchClassifier(dropout)


# --- batches: (args, kwargs) exactly as a training loop passes them -----------------------------
def _padded_mask(batch: int, seq: int, gen: torch.Generator):
    lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=gen)
    lengths[0] = seq
    return (torch.arange(seq)[None, :] < lengths[:, None]).long()  # (B, T): 1 = token, 0 = padding


def _progressions(batch: int, seq: int, gen: torch.Generator):
    """(B, T) tokens in 1..VOCAB-1 that a language model can learn: start + stride * position."""
    start = torch.randint(0, VOCAB - 1, (batch, 1), generator=gen)
    stride = torch.randint(1, 4, (batch, 1), generator=gen)
    return (start + stride * torch.arange(seq)) % (VOCAB - 1) + 1


def lm_batch(batch: int, seq: int, gen: torch.Generator):
    """As a Hugging Face collator pads them: right padding masked out and labelled -100."""
    mask = _padded_mask(batch, seq, gen)
    ids = _progressions(batch, seq, gen) * mask
    labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
    return (), {"input_ids": ids, "attention_mask": mask, "labels": labels}


def nanogpt_batch(batch: int, seq: int, gen: torch.Generator):
    data = _progressions(batch, seq + 1, gen)
    return (data[:, :-1].contiguous(), data[:, 1:].contiguous()), {}


def mlm_batch(batch: int, seq: int, gen: torch.Generator):
    ids = torch.randint(1, VOCAB, (batch, seq), generator=gen)
    mask = _padded_mask(batch, seq, gen)
    ids = ids * mask  # padding uses pad_token_id 0
    labels = torch.where(torch.rand(batch, seq, generator=gen) < 0.3, ids, torch.full_like(ids, -100))
    labels[0, 0] = ids[0, 0]  # at least one position is predicted
    labels = torch.where(mask.bool(), labels, torch.full_like(ids, -100))
    return (), {"input_ids": ids, "attention_mask": mask, "labels": labels}


def cls_batch(batch: int, seq: int, gen: torch.Generator):
    ids = torch.randint(1, VOCAB, (batch, seq), generator=gen)
    mask = _padded_mask(batch, seq, gen)
    labels = ids[:, 0] % 3  # learnable: the class is in the first token, which BERT pools
    return (), {"input_ids": ids * mask, "attention_mask": mask, "labels": labels}


def seq2seq_batch(batch: int, seq: int, gen: torch.Generator):
    """Source tokens right-padded, targets half as long, padding labelled -100 (T5 shifts the
    labels right into decoder inputs itself)."""
    mask = _padded_mask(batch, seq, gen)
    ids = _progressions(batch, seq, gen) * mask
    target = max(seq // 2, 2)
    labels = (ids[:, :target].flip(1) % (VOCAB - 2)) + 2
    labels = torch.where(_padded_mask(batch, target, gen).bool(), labels, torch.full_like(labels, -100))
    return (), {"input_ids": ids, "attention_mask": mask, "labels": labels}


def dict_batch(batch: int, seq: int, gen: torch.Generator):
    ids = torch.randint(1, VOCAB, (batch, seq), generator=gen)
    mask = _padded_mask(batch, seq, gen)
    labels = torch.randint(0, 3, (batch,), generator=gen)
    features = torch.randn(batch, seq, 8, generator=gen)
    features[:, 0, :3] += 3 * F.one_hot(labels, 3)  # the class, in the first position's features
    inputs = {"tokens": ids * mask, "features": features, "mask": mask}
    return ({"inputs": inputs, "labels": labels},), {}


def loss_of(output) -> torch.Tensor:
    """The loss, whether the model returns a ModelOutput, a dict or nanoGPT's (logits, loss)."""
    if isinstance(output, tuple):
        return output[1]
    return output["loss"] if isinstance(output, dict) and not hasattr(output, "loss") else output.loss


# name -> (factory(dropout), batch maker): the models the suite trains with eager parity.
ZOO = {
    "gpt2": (gpt2, lm_batch),
    "bert_mlm": (bert_mlm, mlm_batch),
    "bert_cls": (bert_cls, cls_batch),
    "nanogpt": (nanogpt, nanogpt_batch),
    "t5": (t5, seq2seq_batch),
    "dict_batch": (dict_batch_classifier, dict_batch),
}
