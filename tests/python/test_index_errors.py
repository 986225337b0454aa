"""Bad indices and bounds in the indexing family fail with a KernelError that names the op, the
node and the problem — never a crash or a silently wrong result."""
import pytest
import torch

from op_table import Case, f, i64, expect_named_error, single_node_model

t = torch.tensor

BAD = [
    (Case("Gather", [f(5, 3), i64(1, 5)], None, id="bad-gather"), r"index out of range"),
    (Case("GatherElements", [f(3, 4), t([1, 2])], None, attrs=dict(axis=1), id="bad-ge"), r"indices of rank 1 for data of rank 2"),
    (Case("GatherND", [f(2, 3), t([[0, 1, 2]])], None, id="bad-gnd"), r"indices address 3 dims .* data has rank 2"),
    (Case("GatherND", [f(2, 3, 4), t([[[0]], [[1]], [[0]]])], None, attrs=dict(batch_dims=1), id="bad-gnd-batch"),
     r"batch dim 0 differs"),
    (Case("Slice", [f(4, 6), i64(0), i64(2), i64(1), i64(0)], None, id="bad-slice-step"), r"step 0 on axis 1"),
    (Case("Slice", [f(4, 6), i64(0, 0), i64(2, 2), i64(1, -1)], None, id="bad-slice-axes"), r"axis -1 is sliced twice"),
    (Case("Split", [f(2, 7), i64(2, 4)], None, attrs=dict(axis=1), n_out=2, id="bad-split"),
     r"split sizes \[2, 4\] must sum to the dim \(7\)"),
    (Case("Tile", [f(2, 3), i64(2)], None, id="bad-tile"), r"repeats \[2\] must have one entry per dim"),
    (Case("Trilu", [f(3)], None, id="bad-trilu"), r"input of rank 1 \(needs at least 2\)"),
    (Case("Range", [t(0), t(5), t(0)], None, id="bad-range"), r"delta must be non-zero"),
]


@pytest.mark.parametrize("case,msg", BAD, ids=[c.id for c, _ in BAD])
def test_bad_index_input_names_op_node_and_problem(case, msg):
    model, feeds = single_node_model(case, [torch.zeros(1)] * case.n_out)
    expect_named_error(model, feeds, rf"{case.op} \(node /test/{case.id}\).*{msg}")
