"""torch.onnx's registry of torchlib translations and its decomposition table are built once and
copied into each export (workarounds.torchlib_registry_kept, decomposition_tables_kept): later
exports skip the rebuild, train the same, leave what is kept as it was, and rebuild it when an
operator torchlib names, or a decomposition, appears."""
import pytest
import torch
from torch.onnx._internal.exporter import _decomp, _registration

import torch_ort
from conftest import MLPClassifier, classifier_batch, twin
from torch_ort.ortmodule.export import workarounds


@pytest.fixture
def builds(monkeypatch):
    """How many times torchlib's registry was built, starting from none kept."""
    monkeypatch.setattr(workarounds, "_KEPT_REGISTRIES", {})
    count = [0]
    inner = _registration._torchlib_registry.get_torchlib_ops

    def counting():
        count[0] += 1
        return inner()

    monkeypatch.setattr(_registration._torchlib_registry, "get_torchlib_ops", counting)
    return count


def train(model, steps=2):
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        loss, _ = model(*classifier_batch(8, gen=gen))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_later_exports_reuse_the_registry_and_train_the_same(builds):
    eager, wrapped = twin(MLPClassifier)
    ours = torch_ort.ORTModule(wrapped)
    assert train(ours) == pytest.approx(train(eager), rel=1e-6)
    assert builds[0] == 1
    again_eager, again = twin(MLPClassifier, seed=1)
    ours_again = torch_ort.ORTModule(again)
    assert train(ours_again) == pytest.approx(train(again_eager), rel=1e-6)
    assert builds[0] == 1 and ours.export_count == ours_again.export_count == 1
    # torch_ort's own translations went into each export's copy, never into the kept registry.
    kept = next(iter(workarounds._KEPT_REGISTRIES.values())).registry
    assert not any(d.is_custom for decomps in kept.functions.values() for d in decomps)
    # Outside an export, torch.onnx builds its registry as it always did.
    assert _registration.ONNXRegistry.__dict__["from_torchlib"].__func__.__qualname__ == "ONNXRegistry.from_torchlib"


def test_an_operator_torchlib_names_appearing_rebuilds_it(builds):
    torch_ort.ORTModule(twin(MLPClassifier)[1])(*classifier_batch(4))
    kept = next(iter(workarounds._KEPT_REGISTRIES.values()))
    assert builds[0] == 1 and kept.still_valid()
    name = "torch_ort_registry_probe::appears"
    kept.unresolved.append(name)  # as a torchvision name is while torchvision is not imported
    assert kept.still_valid()
    lib = torch.library.Library("torch_ort_registry_probe", "DEF")
    lib.define("appears(Tensor x) -> Tensor")
    assert not kept.still_valid()
    torch_ort.ORTModule(twin(MLPClassifier, seed=2)[1])(*classifier_batch(4))
    assert builds[0] == 2


@pytest.fixture
def tables(monkeypatch):
    """How many times the decomposition table was built, starting from none kept."""
    monkeypatch.setattr(workarounds, "_KEPT_DECOMPOSITIONS", {})
    count = [0]
    inner = _decomp.create_onnx_friendly_decomposition_table

    def counting(ops):
        count[0] += 1
        return inner(ops)

    monkeypatch.setattr(_decomp, "create_onnx_friendly_decomposition_table", counting)
    return count


def test_the_decomposition_table_is_kept_until_a_decomposition_appears(tables):
    eager, wrapped = twin(MLPClassifier)
    assert train(torch_ort.ORTModule(wrapped)) == pytest.approx(train(eager), rel=1e-6)
    torch_ort.ORTModule(twin(MLPClassifier, seed=1)[1])(*classifier_batch(4))
    assert tables[0] == 1
    assert _decomp.create_onnx_friendly_decomposition_table.__name__ == "counting"  # put back
    lib = torch.library.Library("torch_ort_decomposition_probe", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x + x, "CompositeImplicitAutograd")
    torch_ort.ORTModule(twin(MLPClassifier, seed=2)[1])(*classifier_batch(4))
    assert tables[0] == 2
    assert len(workarounds._KEPT_DECOMPOSITIONS) == 1  # the new table replaced the old one


def test_the_registry_built_with_domains_only_is_the_full_one():
    """Building the kept registry reads only the domain of each traced torchlib function: every
    such domain is its opset's, and the registry built that way holds the same translations, in the
    same order, as the one built reading each function's full signature IR."""
    from onnxscript._internal.values import TracedOnnxFunction
    from onnxscript.function_libs.torch_lib import registration

    traced = [f for ops in registration.default_registry.values() for f in (*ops.overloads, *ops.complex)
              if isinstance(f, TracedOnnxFunction)]
    assert len(traced) > 100
    assert all(f.function_ir.domain == f.opset.domain for f in traced)

    def entries(registry):
        return {target: [(d.onnx_function, d.is_complex, d.is_custom) for d in decomps]
                for target, decomps in registry.functions.items()}

    full = _registration.ONNXRegistry.from_torchlib()
    with workarounds._traced_domains_only():
        assert type(TracedOnnxFunction.__dict__["function_ir"]) is property
        short = _registration.ONNXRegistry.from_torchlib()
    assert entries(short) == entries(full)
    assert traced[0].function_ir.__class__.__name__ == "IRFunction"  # put back
