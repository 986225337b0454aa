#!/usr/bin/env python3
"""The include graph of the torch-free core (csrc/core), stage by stage.

Each folder of csrc/core is a stage; the files at its top (compile.{h,cc}, the front door) are the
last. A stage may include its own headers and those of the stages before it, never one after it:

    ir        the graph, its types, the op traits every stage reads, patterns over the graph
    shapes    symbolic shapes and the shape rules' registry
    eval      the core evaluator (constant folding, the C++ tests' oracle)
    autodiff  the gradient builder and the gradient rules' registry
    passes    graph-to-graph rewrites
    planner   liveness, memory, recompute, placement
    ops       the op families: each registers its traits, shape rule and gradient rule into the
              registries above; nothing below includes them
    compile   import -> passes -> autodiff -> passes -> plan

Nothing in the core includes csrc/runtime, csrc/bindings or torch. Prints the graph (how many
includes run from each stage to each other one) and exits 1 on an include that runs up or out.

    scripts/include_graph.py            # the graph, then the violations if any
    scripts/include_graph.py --quiet    # the violations only
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys

STAGES = ("ir", "shapes", "eval", "autodiff", "passes", "planner", "ops", "compile")
CORE = "csrc/core"
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^">]+)[">]', re.M)
# Headers of these never belong in the core: it builds without torch (and without our runtime).
FOREIGN = ("csrc/runtime/", "csrc/bindings/", "torch/", "ATen/", "c10/", "pybind11/")


def stage_of(path: str) -> str:
    """The stage of a path under csrc/core ("csrc/core/ir/graph.h" -> "ir"; top-level files: compile)."""
    parts = path[len(CORE) + 1:].split("/")
    return parts[0] if len(parts) > 1 else "compile"


def includes(root: str):
    """(file, included path, line number) for every include of every source under csrc/core."""
    for folder, _, names in sorted(os.walk(os.path.join(root, CORE))):
        for name in sorted(names):
            if not name.endswith((".h", ".cc")):
                continue
            path = os.path.relpath(os.path.join(folder, name), root)
            with open(os.path.join(root, path)) as f:
                text = f.read()
            for match in INCLUDE.finditer(text):
                yield path, match.group(1), text.count("\n", 0, match.start()) + 1


def check(root: str):
    """(edges, violations): edges[(from, to)] = count over stages; violations as readable lines."""
    rank = {stage: i for i, stage in enumerate(STAGES)}
    edges = collections.Counter()
    violations = []
    for path, target, line in includes(root):
        source = stage_of(path)
        if source not in rank:
            violations.append(f"{path}: a folder that is no stage ({source}); add it to STAGES in order")
            continue
        if target.startswith(FOREIGN):
            violations.append(f"{path}:{line}: includes {target}, outside the torch-free core")
            continue
        if not target.startswith(CORE + "/"):
            continue  # the standard library, protobuf's messages (csrc/proto), generated tables
        to = stage_of(target)
        if to not in rank:
            violations.append(f"{path}:{line}: includes {target}, in no stage")
            continue
        if to != source:
            edges[(source, to)] += 1
        if rank[to] > rank[source]:
            violations.append(f"{path}:{line}: {source} includes {target}, a later stage ({to})")
    return edges, violations


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quiet", action="store_true", help="print only the violations")
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args(argv)
    edges, violations = check(args.root)
    if not args.quiet:
        print("csrc/core, stage by stage (includes of each earlier stage):")
        for stage in STAGES:
            below = [f"{to} {edges[(stage, to)]}" for to in STAGES if (stage, to) in edges]
            print(f"  {stage:<9} -> {', '.join(below) or '(nothing)'}")
    for v in violations:
        print("error:", v, file=sys.stderr)
    if violations:
        print(f"{len(violations)} include(s) run up a stage or out of the core", file=sys.stderr)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
