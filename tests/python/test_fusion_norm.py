"""skip_layer_norm_fusion and bias_dropout_fusion on the real model exports (NanoGPT, HF GPT-2,
BERT): the passes fire where the patterns are, and training keeps eager parity — losses and
gradients at test_models.py's tolerances, with dropout on and the same seed giving the same masks —
with both passes on and with each disabled. Plus the fused CPU loops' portable path against the
same op-table rows as the AVX-512 one, and bad input to the fused kernels."""
import collections

import onnx
import pytest
import torch

import model_zoo
import test_engine_ops
from op_table import ALL_CASES, OURS, Case, expect_named_error, f, single_node_model
from test_models import make_twins, run_parity

FUSED_CASES = [c for c in ALL_CASES if c.op in ("SkipLayerNorm", "SkipLayerNormGrad", "BiasDropout")]

PASSES = ["skip_layer_norm_fusion", "bias_dropout_fusion"]
L = model_zoo.LAYERS

# Per model exported with dropout > 0: (SkipLayerNorm, LayerNormalization left, BiasDropout).
#   nanogpt (pre-LN): ln_2 of every block and ln_1 of every later block read a residual sum, and
#     so does ln_f: 2·L; the first ln_1 reads the embedding dropout. Both c_proj biases + dropout.
#   gpt2 (pre-LN): the same LayerNorms; its projections are Gemm with the bias inside, so no
#     bias add sits before a dropout.
#   bert_cls (post-LN): both LayerNorms of every layer; the embeddings' LayerNorm reads a
#     broadcasting add (position embeddings (1, T, C)) and stays. Both dense biases + dropout.
EXPECTED = {"nanogpt": (2 * L, 1, 2 * L), "gpt2": (2 * L, 1, 0), "bert_cls": (2 * L, 1, 2 * L)}


@pytest.fixture
def disable(monkeypatch):
    """Builds the engines without the named passes (ORTMODULE_DISABLED_PASSES, read per ORTModule)."""
    def apply(names):
        monkeypatch.setenv("ORTMODULE_DISABLED_PASSES", ",".join(names))
    return apply


def op_counts(ours, which="forward"):
    engine = next(iter(next(iter(ours._plan_cache.runners()))._engines.values()))
    data = engine.forward_graph_onnx() if which == "forward" else engine.training_graph_onnx()
    return collections.Counter(n.op_type for n in onnx.load_from_string(data).graph.node)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_passes_fire_on_model_exports(strict, name):
    _, ours, make_batch = make_twins(name, dropout=0.1)
    args, kwargs = make_batch(2, 16, torch.Generator().manual_seed(0))
    model_zoo.loss_of(ours(*args, **kwargs)).backward()
    fwd, train = op_counts(ours), op_counts(ours, "training")
    sln, ln_left, bd = EXPECTED[name]
    assert (fwd["SkipLayerNorm"], fwd["LayerNormalization"], fwd["BiasDropout"]) == (sln, ln_left, bd), fwd
    assert train["SkipLayerNormGrad"] == sln and train["LayerNormalizationGrad"] == ln_left, train
    assert train["DropoutGrad"] == fwd["Dropout"] + bd  # every training-mode dropout reuses its mask


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("off", [None], ids=["all-on"])  # each pass off: test_pass_parity.py
def test_training_parity_with_dropout(strict, disable, name, off):
    if off:
        disable([off])
    _, ours, losses_e, losses_o = run_parity(name, dropout=0.1, steps=3, shapes=((4, 16), (2, 9)))
    fwd = op_counts(ours)
    fused = {"skip_layer_norm_fusion": fwd["SkipLayerNorm"], "bias_dropout_fusion": fwd["BiasDropout"]}
    for p, n in fused.items():  # the switch really switched, and the pass really fired otherwise
        if p == off:
            assert n == 0, (p, fwd)
        elif p == "skip_layer_norm_fusion" or name != "gpt2":
            assert n > 0, (p, fwd)


def test_training_parity_without_dropout(strict):
    # dropout 0: no Dropout nodes, so BERT's post-LN adds take their bias into SkipLayerNorm.
    _, ours, _, _ = run_parity("bert_cls", steps=3)
    fwd = op_counts(ours)
    assert fwd["SkipLayerNorm"] == 2 * L and fwd["BiasDropout"] == 0, fwd


FP32_CASES = [c for c in FUSED_CASES if all(t is None or t.dtype != torch.float64 and t.dtype != torch.float16
                                           for t in c.inputs[:1])]


@pytest.mark.parametrize("case", FP32_CASES, ids=[c.id for c in FP32_CASES])
def test_fused_loops_match_reference_on_both_cpu_paths(cpu_path, case):
    """Both CPU paths of the fused kernels match the unfused reference (op_table.TOL: fp32 rtol
    1e-5, atol 1e-6): the AVX-512 loops (cpu/layer_norm.cc), and with the optimizer's switch on
    "portable" the kernels' ATen reference path."""
    test_engine_ops.test_kernel_matches_torch(case)


def test_skip_layer_norm_bad_input_names_the_node():
    case = Case("SkipLayerNorm", [f(2, 8), f(2, 7), f(8), f(8)], lambda x, s, g, b: (x, x, x, x), domain=OURS,
                n_out=4, id="bad-skip")
    model, feeds = single_node_model(case, [torch.zeros(2, 8)] * 4)
    expect_named_error(model, feeds, r"SkipLayerNorm \(node /test/bad-skip\).*Skip of shape \[2, 7\]")
    case = Case("SkipLayerNorm", [f(2, 8), f(2, 8), f(5)], lambda x, s, g: (x, x, x, x), domain=OURS, n_out=4,
                id="bad-gamma")
    model, feeds = single_node_model(case, [torch.zeros(2, 8)] * 4)
    expect_named_error(model, feeds, r"SkipLayerNorm \(node /test/bad-gamma\).*Gamma of shape \[5\] must have 8")


def test_bias_dropout_bad_input_names_the_node():
    case = Case("BiasDropout", [f(3, 4), f(5), None, torch.tensor(0.1), torch.tensor(True)],
                lambda x, b, r, t: (x, x > 0), domain=OURS, n_out=2, id="bad-bias")
    model, feeds = single_node_model(case, [torch.zeros(3, 4), torch.zeros(3, 4, dtype=torch.bool)])
    expect_named_error(model, feeds, r"BiasDropout \(node /test/bad-bias\).*Bias of shape \[5\]")
