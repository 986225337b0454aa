"""docs/ops.md is scripts/gen_ops_doc.py's output, and that script's scan of the sources finds exactly
the ops torch_ort._C's registries hold: a registration spelled in a way the scan cannot read fails
here instead of going missing from the page. Every file:line on the page names its op."""
import importlib.util
import pathlib
import re

import pytest

import torch_ort._C as C

ROOT = pathlib.Path(__file__).parents[2]
DOC = ROOT / "docs" / "ops.md"


def _load_script():
    path = ROOT / "scripts" / "gen_ops_doc.py"
    spec = importlib.util.spec_from_file_location("torch_ort_gen_ops_doc", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_script()


@pytest.fixture(scope="module")
def ops():
    return gen.collect()


def test_page_is_current():
    assert DOC.exists(), "docs/ops.md is missing: run .venv/bin/python scripts/gen_ops_doc.py"
    assert gen.render() == DOC.read_text(), \
        "docs/ops.md is stale: run .venv/bin/python scripts/gen_ops_doc.py"


def _keys(ops, attr):
    return {o.key for o in ops.values() if getattr(o, attr)}


def test_scanned_kernels_are_the_kernel_registry(ops):
    assert _keys(ops, "kernel") == set(C.kernel_ops())


def test_scanned_shape_rules_are_the_shape_registry(ops):
    assert _keys(ops, "shape") == set(C.shape_ops())


def test_scanned_gradient_entries_are_the_gradient_registry(ops):
    assert _keys(ops, "gradient") == set(C.gradient_ops())
    differentiable = {o.key for o in ops.values() if o.gradient and not o.no_gradient}
    assert differentiable == set(C.differentiable_ops())


def test_scanned_cuda_kernels_are_the_ones_the_cuda_module_registers(ops):
    pytest.importorskip("torch_ort._C_cuda")  # built only where nvcc is; importing it registers them
    assert {o.name for o in ops.values() if o.cuda} == set(C.cuda_kernels())


def test_scan_finds_something_in_every_column(ops):
    # Guards the comparisons above against a scan and a registry that are both empty.
    for attr in ("kernel", "cuda", "shape", "gradient", "no_gradient", "traits_at", "cases"):
        assert any(getattr(o, attr) for o in ops.values()), f"no op has {attr}"


def test_every_location_on_the_page_names_its_op():
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `")]
    assert rows
    bad = []
    for row in rows:
        label = row.split("|")[1].strip().strip("`")
        name = label.rsplit("::", 1)[-1]
        for path, line in re.findall(r"(csrc/[\w/.\-]+\.\w+):(\d+)", row):
            text = (ROOT / path).read_text().splitlines()[int(line) - 1]
            # Case-insensitive: some lines name the op through a constant (kAtenOp for ATenOp).
            if name.lower() not in text.lower():
                bad.append(f"{label}: {path}:{line} reads {text.strip()!r}")
    assert not bad, "\n".join(bad)


def test_every_op_lives_in_one_family_and_its_parity_rows_say_so(ops):
    """An op's traits line, shape rule and gradient entry are in one family file
    (csrc/core/ops/<family>.cc), and its parity rows in the op_table module of that name."""
    import sys
    sys.path.insert(0, str(ROOT / "tests" / "python"))
    from op_table import ALL_CASES

    def family(o):
        files = {where.split(":")[0] for where in (o.shape, o.gradient, o.traits_at) if where}
        core = {f for f in files if f.startswith("csrc/core/ops/")}
        assert core == files, f"{o.label}: parts outside csrc/core/ops: {sorted(files - core)}"
        assert len(core) <= 1, f"{o.label}: parts in several family files: {sorted(core)}"
        return pathlib.Path(core.pop()).stem if core else None

    families = {o.key: family(o) for o in ops.values()}
    misplaced = [(c.id, c.family, families.get(f"{c.domain}::{c.op}")) for c in ALL_CASES
                 if families.get(f"{c.domain}::{c.op}") not in (None, c.family)]
    assert not misplaced, f"parity rows outside their op's family module (id, module, family): {misplaced}"


def test_exporter_vocabulary_gap_is_the_documented_one():
    """Every ONNX op a translation of the exporter's default registry calls either has a kernel or
    is on the page's list of those without one (which the page says how each runs): an op that
    gains a kernel leaves the list, one the exporter starts emitting joins it."""
    vocabulary = gen.exporter_vocabulary()
    assert len(vocabulary) > 100 and "MatMul" in vocabulary and "Mod" in vocabulary  # the walk found it
    gap = gen.vocabulary_gap(set(C.kernel_ops()))
    missing = {op for op, _, _ in gap}
    assert missing == {op for op in vocabulary if f"::{op}" not in set(C.kernel_ops())}
    documented = re.findall(r"^\| `(\w+)` \|", DOC.read_text().split("## Exporter ops without a kernel")[1], re.M)
    assert sorted(documented) == sorted(missing), "docs/ops.md is stale: run .venv/bin/python scripts/gen_ops_doc.py"
    for op in ("Mod", "Sin", "Cos", "ArgMax", "ReduceMax", "ScatterND", "ScatterElements", "TopK", "NonZero",
               "Softplus", "Clip", "Einsum"):
        assert op not in missing, f"{op} is emitted for the supported models and must have a kernel"
