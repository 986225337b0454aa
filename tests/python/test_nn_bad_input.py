"""NN-family kernels reject bad input with an error that names the op, the node and the problem."""
import pytest
import torch

from op_table import OURS, Case, expect_named_error, f, i64, single_node_model

BAD = [
    (Case("LayerNormalization", [f(3, 4), f(5), f(4)], None), r"LayerNormalization \(node /test/.*Scale of shape \[5\]"),
    (Case("LayerNormalization", [f(3, 4), f(4)], None, attrs=dict(axis=2)), "axis 2 is out of range for rank 2"),
    (Case("Gelu", [f(3)], None, attrs=dict(approximate="erf")), "approximate must be 'none' or 'tanh', got 'erf'"),
    (Case("Embedding", [f(5, 2), i64(1, 7)], None, domain=OURS), r"Embedding \(node /test/Embedding\).*out of range"),
    (Case("Embedding", [f(5), i64(1)], None, domain=OURS), r"weight must be \(num_embeddings, dim\)"),
    (Case("CrossEntropyLoss", [f(3, 4), i64(0, 1, 2)], None, attrs=dict(label_smoothing=1.5), domain=OURS),
     r"label_smoothing must be in \[0, 1\]"),
    (Case("CrossEntropyLoss", [f(3, 4), i64(0, 1)], None, attrs=dict(label_smoothing=0.1), domain=OURS),
     "does not match|size"),
    (Case("Dropout", [f(3), torch.tensor(1.5), torch.tensor(True)], None), r"ratio must be in \[0, 1\], got 1.5"),
]


@pytest.mark.parametrize("case, message", BAD, ids=[c.id + "-" + str(i) for i, (c, _) in enumerate(BAD)])
def test_bad_input_is_named(case, message):
    fake_outputs = [torch.zeros(1)] * case.n_out  # only their dtype/rank reach the model
    model, feeds = single_node_model(case, fake_outputs)
    expect_named_error(model, feeds, message)
