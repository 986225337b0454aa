"""ORTMODULE_CACHE_DIR: a second process with the same model and schema skips export; bad
entries are rejected and rewritten; graphs with PythonOps are not cached."""
import os
import sys
import textwrap

import pytest
import torch

from torch_ort import ORTModule

import forkserver

SCRIPT = textwrap.dedent("""
    import json, sys, time, torch
    from torch_ort import ORTModule
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    ours = ORTModule(model)
    x = torch.randn(8, 16)
    start = time.perf_counter()
    loss = ours(x).pow(2).mean()
    loss.backward()
    first = time.perf_counter() - start
    print(json.dumps({"exports": ours.export_count, "hits": ours.cache_hit_count,
                      "loss": loss.item(), "grad": model[0].weight.grad.sum().item(),
                      "first_step_s": first}))
""")


def _run(cache_dir):
    env = dict(os.environ, ORTMODULE_CACHE_DIR=str(cache_dir), ORTMODULE_FALLBACK_POLICY="FALLBACK_DISABLE")
    out = forkserver.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    import json
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_skips_export(tmp_path):
    first, second = _run(tmp_path), _run(tmp_path)
    assert (first["exports"], first["hits"]) == (1, 0)
    assert (second["exports"], second["hits"]) == (0, 1)
    assert second["loss"] == first["loss"] and second["grad"] == first["grad"]
    assert len(list(tmp_path.glob("*.onnx"))) == 1


class Net(torch.nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.fc = torch.nn.Linear(4, width)

    def forward(self, x):
        return self.fc(x).relu().sum()


def test_a_module_with_hooks_is_neither_cached_nor_read_from_the_cache(strict, monkeypatch, tmp_path):
    """A forward hook runs inside the graph, and the key (structure, not code) cannot tell two
    hooks apart: a module with one on itself or a submodule exports, and nothing is written."""
    monkeypatch.setenv("ORTMODULE_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    plain = ORTModule(Net())
    x = torch.randn(2, 4)
    plain(x).backward()
    hooked = Net()
    hooked.load_state_dict(plain.state_dict())
    hooked.fc.register_forward_hook(lambda module, args, out: out * 3)
    ours = ORTModule(hooked)
    out = ours(x)
    assert (ours.export_count, ours.cache_hit_count) == (1, 0)
    torch.testing.assert_close(out, hooked(x))
    assert len(list(tmp_path.glob("*.onnx"))) == 1  # plain's entry only


def test_in_process_hit_and_key_changes(strict, monkeypatch, tmp_path):
    monkeypatch.setenv("ORTMODULE_CACHE_DIR", str(tmp_path))
    a = ORTModule(Net())
    a(torch.randn(2, 4)).backward()
    b = ORTModule(Net())
    b(torch.randn(3, 4)).backward()
    assert (a.export_count, b.export_count, b.cache_hit_count) == (1, 0, 1)
    c = ORTModule(Net(width=9))            # another structure: another key
    c(torch.randn(2, 4)).backward()
    d = ORTModule(Net())                    # another schema (float64 input): another key
    d.double()
    d(torch.randn(2, 4, dtype=torch.float64)).backward()
    assert (c.export_count, d.export_count) == (1, 1)
    assert len(list(tmp_path.glob("*.json"))) == 3


def _entry(tmp_path):
    onnx_file = next(tmp_path.glob("*.onnx"))
    return onnx_file, onnx_file.with_suffix(".json")


def _rewrite_graph(tmp_path, edit):
    """Replaces the entry's graph with edit(ModelProto) and records the new digest, so only the
    checks after the digest can reject it (what someone able to write the directory can do)."""
    import hashlib
    import json

    import onnx

    onnx_file, json_file = _entry(tmp_path)
    model = onnx.load_model_from_string(onnx_file.read_bytes())
    data = edit(model)
    data = data if isinstance(data, bytes) else model.SerializeToString()
    onnx_file.write_bytes(data)
    meta = json.loads(json_file.read_text())
    meta["onnx_sha256"] = hashlib.sha256(data).hexdigest()
    json_file.write_text(json.dumps(meta))


def _damage(tmp_path, damage):
    onnx_file, json_file = _entry(tmp_path)
    if damage == "truncated graph":
        onnx_file.write_bytes(onnx_file.read_bytes()[:50])
    elif damage == "truncated record":
        json_file.write_bytes(json_file.read_bytes()[:40])
    elif damage == "empty graph":
        onnx_file.write_bytes(b"")
    elif damage == "other format":
        json_file.write_text(json_file.read_text().replace('"format": 1', '"format": 99'))
    elif damage == "other torch_ort version":
        import torch_ort
        json_file.write_text(json_file.read_text().replace(f'"torch_ort": "{torch_ort.__version__}"',
                                                           '"torch_ort": "0.0.1"'))
    elif damage == "not a ModelProto (digest matches)":
        _rewrite_graph(tmp_path, lambda m: b"\xff\xff\xff not protobuf")
    elif damage == "other inputs (digest matches)":
        _rewrite_graph(tmp_path, lambda m: m.graph.input.pop())
    elif damage == "graph the engine refuses (digest matches)":
        def refuse(m):
            m.graph.node[0].input[0] = "no_such_value"  # the importer names the dangling input
        _rewrite_graph(tmp_path, refuse)
    elif damage == "an ATenOp the entry does not record (digest matches)":
        _rewrite_graph(tmp_path, lambda m: _aten_op_node(m, "aten::relu.default"))
    elif damage == "a recorded fallback op outside aten (digest matches)":
        _rewrite_graph(tmp_path, lambda m: _aten_op_node(m, "_c10d_functional::all_reduce.default"))
        _record_aten_ops(tmp_path, ["_c10d_functional::all_reduce.default"])
    else:
        raise AssertionError(damage)


def _aten_op_node(m, name):
    import onnx.helper

    node = m.graph.node[0]
    del node.attribute[:]
    node.op_type, node.domain = "ATenOp", "com.torch_ort"
    node.attribute.append(onnx.helper.make_attribute("aten_op", name))


def _record_aten_ops(tmp_path, names):
    import json

    json_file = _entry(tmp_path)[1]
    meta = json.loads(json_file.read_text())
    meta["aten_ops"] = names
    json_file.write_text(json.dumps(meta))


DAMAGES = ["truncated graph", "truncated record", "empty graph", "other format",
           "other torch_ort version", "not a ModelProto (digest matches)",
           "other inputs (digest matches)", "graph the engine refuses (digest matches)",
           "an ATenOp the entry does not record (digest matches)",
           "a recorded fallback op outside aten (digest matches)"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_entry_is_rejected_and_rewritten(strict, monkeypatch, tmp_path, damage):
    monkeypatch.setenv("ORTMODULE_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    clean = ORTModule(Net())
    x = torch.randn(2, 4)
    clean(x).backward()
    _damage(tmp_path, damage)
    torch.manual_seed(0)
    again = ORTModule(Net())
    loss = again(x)
    loss.backward()
    assert (again.export_count, again.cache_hit_count) == (1, 0)
    assert loss.item() == clean(x).item()  # (same seed, same weights)
    assert [p.grad for p in again.parameters()][0].equal(next(clean.parameters()).grad)
    fresh = ORTModule(Net())
    fresh(torch.randn(2, 4)).backward()
    assert (fresh.export_count, fresh.cache_hit_count) == (0, 1)  # the rewritten entry is good


def test_entry_records_the_versions_that_wrote_it(strict, monkeypatch, tmp_path):
    import json

    import torch_ort

    monkeypatch.setenv("ORTMODULE_CACHE_DIR", str(tmp_path))
    ORTModule(Net())(torch.randn(2, 4)).backward()
    meta = json.loads(_entry(tmp_path)[1].read_text())
    assert (meta["torch_ort"], meta["torch"]) == (torch_ort.__version__, torch.__version__)


class Counted(torch.autograd.Function):
    calls = 0

    @staticmethod
    def forward(ctx, x):
        Counted.calls += 1
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class WithFunction(Net):
    def forward(self, x):
        return Counted.apply(self.fc(x)).sum()


def test_cached_graph_naming_a_python_op_is_never_run(strict, monkeypatch, tmp_path, torch_ort_log):
    """An entry whose graph has a PythonOp node, even one naming a Function this process did
    register (another model's), is rejected: cached graphs never run Python."""
    from torch_ort.ortmodule.export import python_op

    other = ORTModule(WithFunction())           # registers a Counted call site in this process
    other(torch.randn(2, 4)).backward()
    (func_id,) = [i for i, s in python_op._SITES.items() if s.function is Counted]
    monkeypatch.setenv("ORTMODULE_CACHE_DIR", str(tmp_path))
    ORTModule(Net())(torch.randn(2, 4)).backward()

    def hijack(m):
        import onnx.helper

        node = m.graph.node[0]
        del node.attribute[:]
        node.op_type, node.domain = "PythonOp", "com.torch_ort"
        node.attribute.extend([onnx.helper.make_attribute("func_id", func_id),
                               onnx.helper.make_attribute("name", "os.system")])
        del node.input[1:]
    _rewrite_graph(tmp_path, hijack)
    calls = Counted.calls
    again = ORTModule(Net())
    again(torch.randn(2, 4)).backward()
    assert Counted.calls == calls
    assert (again.export_count, again.cache_hit_count) == (1, 0)
    assert any("PythonOp node" in r.getMessage() for r in torch_ort_log)


def test_python_op_graphs_are_not_cached(strict, monkeypatch, tmp_path):
    from test_python_op import Net as FnNet

    monkeypatch.setenv("ORTMODULE_CACHE_DIR", str(tmp_path))
    ORTModule(FnNet("ste"))(torch.randn(2, 6)).backward()
    assert not list(tmp_path.glob("*.onnx"))


class Config:
    """A model configuration object, as Hugging Face models hold one (`module.config`): its fields
    change the forward without appearing in the module's repr."""

    def __init__(self, scale: float, act=None):
        self.scale = scale
        self._attn_implementation = "sdpa"
        self.act = act or torch.tanh


class Configured(torch.nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.config.act(self.fc(x)) * self.config.scale
        return y * 2 if self.config._attn_implementation == "eager" else y


@pytest.mark.parametrize("change", ["field", "private field", "function"])
def test_a_config_the_repr_does_not_show_is_in_the_key(strict, monkeypatch, tmp_path, change):
    """Two modules that differ only in a field of the config they hold (a number, a private field
    like Hugging Face's `_attn_implementation`, a function) never reuse each other's graph."""
    monkeypatch.setenv("ORTMODULE_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    first = Configured(Config(1.0))
    ORTModule(first)(torch.randn(2, 4)).sum().backward()
    second = Configured(Config(1.0))
    second.load_state_dict(first.state_dict())
    if change == "field":
        second.config.scale = 3.0
    elif change == "private field":
        second.config._attn_implementation = "eager"
    else:
        second.config.act = torch.sigmoid
    ours = ORTModule(second)
    x = torch.randn(2, 4)
    out = ours(x)
    assert (ours.export_count, ours.cache_hit_count) == (1, 0)
    torch.testing.assert_close(out, second(x))
    same = Configured(Config(1.0))  # the first one's config again: a hit
    same.load_state_dict(first.state_dict())
    again = ORTModule(same)
    torch.testing.assert_close(again(x), same(x))
    assert (again.export_count, again.cache_hit_count) == (0, 1)


def test_an_attribute_that_holds_itself_leaves_the_key_computable():
    from torch_ort.ortmodule.export import disk_cache
    module = Net()
    module.loop = [1]
    module.loop.append(module.loop)
    module.table = {"a": {"b": [1, 2]}}
    key = disk_cache.cache_key(module, "schema", 17, [])
    module.table["a"]["b"].append(3)
    assert disk_cache.cache_key(module, "schema", 17, []) != key


def test_export_options_are_in_the_key(strict, monkeypatch, tmp_path):
    """An option that changes what the export produces (here: data-dependent decisions taken from
    the values) is part of the key: the graph exported under one setting is not read under another."""
    from torch_ort.ortmodule.export import disk_cache
    from torch_ort.ortmodule.policy.variables import Settings
    module = Net()
    keys = {disk_cache.cache_key(module, "schema", 17, [], disk_cache.export_options(Settings.from_env(env)))
            for env in ({}, {"ORTMODULE_EXPORT_DECISIONS_FROM_VALUES": "0"},
                        {"ORTMODULE_MEMORY_OPT_LEVEL": "1"}, {"ORTMODULE_SKIPPED_AUTOGRAD_FUNCTIONS": "a.B"})}
    assert len(keys) == 4


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.scale = 2.0

    def forward(self, x):
        return (self.fc(x) * self.scale).pow(2).mean()


def test_a_cached_graph_knows_which_attributes_its_export_read(strict, monkeypatch, tmp_path):
    """As after an export: setting an attribute the export never read (a step counter) keeps a
    graph read from the cache; setting one it read exports again and follows the new value."""
    monkeypatch.setenv("ORTMODULE_CACHE_DIR", str(tmp_path))
    x = torch.randn(2, 4)
    ORTModule(Scaled())(x).backward()
    torch.manual_seed(0)
    eager = Scaled()
    ours = ORTModule(Scaled())
    ours.load_state_dict(eager.state_dict())
    ours(x).backward()
    assert (ours.export_count, ours.cache_hit_count) == (0, 1)
    ours.step = 1
    ours(x).backward()
    assert ours.export_count == 0
    ours.scale = eager.scale = 3.0
    torch.testing.assert_close(ours(x), eager(x))
    assert ours.export_count == 1
