"""The shape of the source tree, kept as it is easy to change: no Python file of torch_ort over 400
lines and no class over 250; no import cycle among torch_ort's modules, and ortmodule's stage
packages import only earlier ones; the C++ core's stages include only earlier stages
(scripts/include_graph.py). These read files; none imports torch."""
import ast
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "torch_ort")
MAX_FILE_LINES, MAX_CLASS_LINES = 400, 250


def sources():
    for folder, _, names in sorted(os.walk(PACKAGE)):
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, ROOT), open(path).read()


def module_name(rel: str) -> str:
    name = rel[:-3].replace(os.sep, ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def is_module(name: str) -> bool:
    """A module of the package: a .py file or package, or an extension (torch_ort._C)."""
    folder, _, leaf = name.rpartition(".")
    where = os.path.join(ROOT, *folder.split("."))
    return os.path.isdir(os.path.join(where, leaf)) or (
        os.path.isdir(where) and any(f.split(".")[0] == leaf for f in os.listdir(where)))


def imports(rel: str, text: str) -> set[str]:
    """The torch_ort modules `rel` imports, wherever in the file (a function-local import is an
    edge too), except under `if TYPE_CHECKING:`. `from package import name` is an edge to the
    module `package.name` when there is one, else to the package."""
    name, package = module_name(rel), rel.endswith("__init__.py")
    found = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for c in child.orelse:
                    visit(c)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("torch_ort"))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = name.split(".")[:len(name.split(".")) - child.level + package]
                    base = ".".join(parts + ([child.module] if child.module else []))
                if base.startswith("torch_ort"):
                    for a in child.names:
                        found.add(f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base)
            visit(child)
    visit(ast.parse(text))
    found.discard(name)
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))
    for v in sorted(edges):
        if v not in index:
            connect(v)
    return out


def test_no_python_file_over_400_lines_and_no_class_over_250():
    too_long = []
    for rel, text in sources():
        if text.count("\n") > MAX_FILE_LINES:
            too_long.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                too_long.append(f"{rel}: class {node.name}, {node.end_lineno - node.lineno + 1} lines")
    assert not too_long, too_long


def test_no_import_cycle():
    edges = {module_name(rel): imports(rel, text) for rel, text in sources()}
    assert "torch_ort.ortmodule.engine.runner" in edges["torch_ort.ortmodule.ortmodule"]
    assert not cycles(edges), cycles(edges)


STAGES = ("policy", "integrations", "export", "engine")  # torch_ort/ortmodule's packages, in order


def test_stage_packages_import_only_earlier_ones():
    """policy <- integrations <- export <- engine <- ortmodule.py and the other top-level modules."""
    def stage(module: str):
        parts = module.split(".")
        return parts[2] if len(parts) > 3 and parts[1] == "ortmodule" and parts[2] in STAGES else None
    upward = []
    for rel, text in sources():
        here = stage(module_name(rel))
        for target in imports(rel, text):
            there = stage(target)
            if here and there and STAGES.index(there) > STAGES.index(here):
                upward.append(f"{rel} imports {target}")
            elif here and there is None and target.startswith("torch_ort.ortmodule.") \
                    and target.split(".")[2] not in STAGES:
                upward.append(f"{rel} imports {target}, a top-level module of torch_ort.ortmodule")
    assert not upward, upward


def test_the_cycle_finder_finds_a_cycle():
    """Two modules that import each other (one inside a function) are a cycle; a TYPE_CHECKING
    import is not an edge."""
    a = imports("torch_ort/a.py", "def f():\n    from torch_ort import b\n")
    b = imports("torch_ort/b.py", "from typing import TYPE_CHECKING\nimport torch_ort.a\n"
                "if TYPE_CHECKING:\n    from torch_ort import c\n")
    assert a == {"torch_ort"} and b == {"torch_ort.a"}  # (b and c are no modules of this tree)
    assert cycles({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z"]]


def load_include_graph():
    spec = importlib.util.spec_from_file_location("include_graph", os.path.join(ROOT, "scripts", "include_graph.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_core_includes_run_down_the_stages():
    """The script passes on the tree, and it would fail an include that runs up a stage or out
    of the core."""
    graph = load_include_graph()
    edges, violations = graph.check(ROOT)
    assert not violations, violations
    assert ("ops", "autodiff") in edges and ("compile", "planner") in edges
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "include_graph.py")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "planner   ->" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("source, include, problem", [
    ("ir/graph.h", "csrc/core/ops/families.h", "a later stage (ops)"),
    ("passes/dce.cc", "csrc/core/planner/plan.h", "a later stage (planner)"),
    ("shapes/sym_dim.cc", "csrc/runtime/kernel.h", "outside the torch-free core"),
    ("eval/eval.cc", "ATen/ops/add.h", "outside the torch-free core"),
])
def test_include_graph_fails_an_upward_include(tmp_path, source, include, problem):
    graph = load_include_graph()
    path = tmp_path / "csrc" / "core" / source
    path.parent.mkdir(parents=True)
    path.write_text(f'#include "csrc/core/ir/graph.h"\n#include "{include}"\n')
    edges, violations = graph.check(str(tmp_path))
    assert len(violations) == 1 and problem in violations[0] and f"{source}:2" in violations[0], violations
