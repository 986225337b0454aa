#!/usr/bin/env bash
# The user's view of a release: a new virtual environment outside the checkout holding only torch
# (and what torch requires);
# the sdist and a wheel built from it by that environment's pip, as `pip install` would
# (scripts/build_wheel.sh); the wheel's name, plain version and manylinux tag, and that it
# carries no copy of torch's or CUDA's libraries; the wheel installed there (nothing of the tree
# on sys.path) under the distribution name torch-ort-engine, beside exactly what its METADATA
# declares for itself and its examples extra (taken from .venv, no download); the getting-started MLP trained
# through it with fallback disabled, checking that torch_ort comes from that environment and that
# the losses match eager PyTorch's.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-.venv/bin/python}
log() { echo "[check_wheel] $*"; }

# One fixed folder, and ccache told nothing of the checkout: the build's paths (pip's unpacked sdist,
# the new environment's torch headers) are then the same from run to run, so the private
# protobuf and the extensions are cache hits after the first run instead of a cold build each time.
DIR=${TMPDIR:-/tmp}/torch_ort-check-wheel
rm -rf "$DIR" && mkdir -p "$DIR"
trap 'rm -rf "$DIR"' EXIT
unset CCACHE_BASEDIR  # setup.py then sets it to the unpacked sdist (its default)
base=$("$PY" -c 'import sys; print(sys._base_executable)')
# The distribution's version (2.15.0), not torch.__version__ (2.15.0+cu132): pip resolves the former.
torch_version=$("$PY" -c 'from importlib.metadata import version; print(version("torch"))')
log "a fresh venv in $DIR with torch==$torch_version"
"$base" -m venv "$DIR/v"
# Installed distributions of .venv, as hard links of their files (RECORD), not a second unpacking
# of 5 GB (100 s on 2 cores) and no download: link REQUIREMENT... takes the named ones and all
# they require, transitively, with the extras asked. pip then sees the same installed
# distributions as after installing them itself; nothing else of .venv is there.
link() {
"$PY" - "$DIR/v" "$@" <<'LINK'
import os, shutil, sys, sysconfig
from importlib.metadata import distribution
from packaging.requirements import Requirement
dest = sysconfig.get_paths(vars={"base": sys.argv[1], "platbase": sys.argv[1]})["purelib"]
todo, seen, linked = [Requirement(r) for r in sys.argv[2:]], set(), []
while todo:  # torch needs cuda-toolkit[cufile,...]
    req = todo.pop()
    dist = distribution(req.name)
    key = (dist.metadata["Name"].lower().replace("_", "-"), frozenset(req.extras))
    if key in seen:
        continue
    seen.add(key)
    for r in map(Requirement, dist.requires or []):
        if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
            todo.append(r)
    metadata = next(f for f in dist.files if f.name == "METADATA")
    if key[0] in linked or os.path.exists(os.path.join(dest, metadata)):
        continue  # linked already (by an earlier call)
    linked.append(key[0])
    for f in dist.files or []:
        src = os.path.realpath(dist.locate_file(f))
        rel = os.path.relpath(src, os.path.realpath(str(dist.locate_file(""))))
        if rel.startswith("..") or not os.path.isfile(src):
            continue  # console scripts in bin/: not needed
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
        try:
            os.link(src, os.path.join(dest, rel))
        except OSError:  # another file system
            shutil.copy2(src, os.path.join(dest, rel))
print(f"[check_wheel] linked {len(linked)} distributions: {', '.join(sorted(linked))}")
LINK
}
link torch  # the build (pip's isolated environment) compiles against this environment's torch
"$DIR/v/bin/python" -c "import torch; assert torch.__version__.split('+')[0] == '$torch_version', torch.__version__"
PYTHON="$DIR/v/bin/python" scripts/build_wheel.sh
wheel=$(ls dist/torch_ort_engine-*.whl)
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' torch_ort/_version.py)
# torch_ort_engine-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl: no local version, a manylinux tag
[[ "$(basename "$wheel")" =~ ^torch_ort_engine-${version//./\.}-cp3[0-9]+-cp3[0-9]+-manylinux_[0-9]+_[0-9]+_x86_64\.whl$ ]] ||
  { log "error: unexpected wheel name $(basename "$wheel")"; exit 1; }
bundled=$("$PY" -c 'import sys, zipfile; print(" ".join(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if ".libs/" in n))' "$wheel")
[ -z "$bundled" ] || { log "error: the wheel bundles libraries: $bundled"; exit 1; }
# What the wheel and its examples extra declare, from its METADATA: a dependency it forgets to
# declare is missing there, and the example below fails to import it.
mapfile -t requires < <("$PY" - "$wheel" <<'REQ'
import sys, zipfile
from email.parser import Parser
from packaging.requirements import Requirement
wheel = zipfile.ZipFile(sys.argv[1])
meta = Parser().parsestr(wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode())
for text in meta.get_all("Requires-Dist") or []:
    r = Requirement(text)
    if r.marker is None or r.marker.evaluate({"extra": "examples"}):
        r.marker = None
        print(r)
REQ
)
link "${requires[@]}"
log "installing $(basename "$wheel")[examples]"
"$DIR/v/bin/pip" install -q "$wheel[examples]"
"$DIR/v/bin/python" -c "from importlib.metadata import version; v = version('torch-ort-engine'); \
print('[check_wheel] installed torch-ort-engine', v); assert v == '$version', v"

cp examples/getting_started.py "$DIR/"
cd "$DIR"  # the example's folder is sys.path[0]; it holds nothing of torch_ort
"$DIR/v/bin/python" -c "import torch_ort, sys; f = torch_ort.__file__; print('[check_wheel] torch_ort', \
torch_ort.__version__, 'from', f); sys.exit(0 if f.startswith('$DIR/v/') and not f.startswith('$ROOT/') else 1)"
ORTMODULE_FALLBACK_POLICY=FALLBACK_DISABLE "$DIR/v/bin/python" getting_started.py --steps 60 | tee out.txt
# "max |loss difference| over 60 steps: 1.23e-07": the engine's losses against eager PyTorch's.
"$DIR/v/bin/python" - <<'PY'
import re
text = open("out.txt").read()
diff = float(re.search(r"max \|loss difference\| over \d+ steps: (\S+)", text).group(1))
exports = int(re.search(r"ORTModule exports: (\d+)", text).group(1))
assert exports >= 1 and diff < 1e-4, (exports, diff)
print(f"[check_wheel] ok: trained through the installed wheel, max loss difference {diff:.1e}")
PY
