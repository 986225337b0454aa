"""The docs match the code: the configuration page's variable table is config.documentation(),
every public name is in the user guide, every ORTMODULE_* name the docs mention exists (ours, or
ONNX Runtime's that we do not read: config.ORT_ONLY), the README points to every page, every
relative link and anchor between the pages resolves, and the migration page explains every
ORT_ONLY variable, keeps its two sections and lists ONNX Runtime 1.19's public names."""
import importlib.util
import pathlib
import re

import torch_ort
import torch_ort.optim
import torch_ort.utils.data
from torch_ort.ortmodule.policy.variables import ORT_ONLY, VARIABLES, documentation

ROOT = pathlib.Path(__file__).parents[2]
GUIDE = (ROOT / "docs" / "user_guide.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
README = (ROOT / "README.md").read_text()
OTHER_DOCS = {p.name: p.read_text() for p in (ROOT / "docs").glob("*.md")}


def test_configuration_page_lists_every_variable_as_the_table_defines_it():
    assert documentation() in CONFIGURATION, "regenerate the table from config.documentation()"
    for var in VARIABLES:
        assert f"`{var.name}`" in CONFIGURATION


def test_docs_name_no_variable_that_does_not_exist():
    known = {v.name for v in VARIABLES} | {v.name for v in ORT_ONLY}
    for name, text in (("README.md", README), *OTHER_DOCS.items()):
        named = set(re.findall(r"ORTMODULE_[A-Z0-9_]+[A-Z0-9]", text))  # digits: ..._ZERO_STAGE3
        assert named <= known, f"{name} names unknown variables {sorted(named - known)}"


def test_guide_covers_the_public_api():
    names = [*torch_ort.__all__, *torch_ort.optim.__all__, *torch_ort.utils.data.__all__,
             "export_onnx", "save_as_onnx", "memory_report"]
    if importlib.util.find_spec("transformers") is not None:  # torch_ort.utils.hf imports it
        hf = importlib.import_module("torch_ort.utils.hf")
        names += [f"torch_ort.utils.hf.{n}" for n in hf.__all__]
    missing = [n for n in names if n not in ("optim", "utils") and n not in GUIDE]
    assert not missing, f"the user guide does not mention {missing}"


def test_readme_points_to_every_page():
    missing = [name for name in OTHER_DOCS if f"(docs/{name})" not in README]
    assert not missing, f"the README does not link {missing}"


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_and_anchor_resolves():
    pages = {"README.md": README, **{f"docs/{n}": t for n, t in OTHER_DOCS.items()}}
    anchors = {name: {_slug(h) for h in re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.S),
                                                   flags=re.M)}
               for name, text in pages.items()}
    broken = []
    for name, text in pages.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if "://" in target:
                continue
            path, _, anchor = target.partition("#")
            resolved = (ROOT / name).parent / path if path else ROOT / name
            key = resolved.resolve().relative_to(ROOT.resolve()).as_posix() if resolved.exists() else None
            if key is None:
                broken.append(f"{name}: {target} (no such file)")
            elif anchor and anchor not in anchors.get(key, set()):
                broken.append(f"{name}: {target} (no heading '{anchor}' in {key})")
    assert not broken, broken


def test_migration_page_is_linked_and_explains_what_we_do_not_read():
    page = OTHER_DOCS["migration.md"]
    assert "(migration.md)" in GUIDE
    sections = re.findall(r"^## (.+)$", page, flags=re.M)
    assert sections == ["Installing over ONNX Runtime's packages", "Matched", "Behaviours that differ, on purpose",
                        "ONNX Runtime 1.19's public names"], sections
    differences = page.split("## Behaviours that differ, on purpose")[1].split("\n## ")[0]
    for var in ORT_ONLY:
        assert f"`{var.name}" in differences, f"migration.md does not say why {var.name} is not read"
    # one entry per difference: each a bullet opening with a bold title
    entries = [line for line in differences.splitlines() if line.startswith("- ")]
    assert entries and all(line.startswith("- **") for line in entries), entries


def test_migration_page_lists_every_onnx_runtime_variable_in_its_names_table():
    page = OTHER_DOCS["migration.md"]
    table = page.split("## ONNX Runtime 1.19's public names")[1]
    ort_names = {v.name for v in ORT_ONLY} | {v.name for v in VARIABLES if "ours, not ORT's" not in v.help}
    missing = [n for n in sorted(ort_names) if f"`{n}`" not in table]
    assert not missing, f"migration.md's names table does not list {missing}"
    for name in ("ORTModule", "DebugOptions", "LogLevel", "DEVINFO", "FusedAdam", "FP16_Optimizer",
                 "LoadBalancingDistributedSampler", "LoadBalancingDistributedBatchSampler"):
        assert name in table, name


# A path in the repository as the README names it: a link target, or a token under a top-level
# folder (in prose, backticks or the map), e.g. scripts/test.sh, csrc/core/, examples/*.py.
_README_PATH = re.compile(r"(?<![\w/.-])((?:csrc|torch_ort|tests|benchmarks|examples|scripts|docs|\.ci)/[\w./*-]*)")


def test_readme_names_only_paths_that_exist():
    links = [m for m in re.findall(r"\]\(([^)#\s]+)", README) if "://" not in m]
    named = links + _README_PATH.findall(README)
    missing = []
    for path in named:
        path = path.rstrip("/.")
        found = list(ROOT.glob(path)) if "*" in path else [ROOT / path] if (ROOT / path).exists() else []
        if not found:
            missing.append(path)
    assert len(named) > 10 and not missing, missing
