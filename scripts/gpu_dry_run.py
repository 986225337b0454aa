"""Runs scripts/gpu_check.sh as the GPU machine would, up to each process's first CUDA call, on a
machine without a GPU: a failure to import, a wrong path or a missing file fails here instead of
costing a GPU run.

What the GPU machine has, and so what the dry run makes:
- a copy of the tree: the files git tracks or would track, plus the ignored paths that
  `scripts/gpu_check.sh --carry` names (docs/gpu.md), in a temporary folder;
- a bare `python3` that has torch and the other packages but no virtual environment of ours and no
  .pth file putting this checkout on the path: a fresh virtual environment whose only addition is
  the package folder of .venv (torch_ort's .pth there is not read: only a site directory's .pth
  files are);
- no network: the run is in a network namespace of its own (unshare), or, where none can be made,
  with every proxy pointed at a closed local port;
- compilers named by absolute paths in CXX and CC (that machine sets CXX=/opt/gcc/bin/g++): the
  carried protobuf-lite must be taken as built whatever the compilers are called;
- no download cache: XDG_CACHE_HOME is an empty folder and TORCH_ORT_GRPC_TOOLS_SDIST is unset, so
  a build that does not take the carried library fails instead of rebuilding it from this
  machine's cached sources.
The build part compiles nothing: it runs scripts/build_protobuf.py offline from the carried files,
and the extensions built in this checkout stand in for the ones the GPU machine compiles.

Every Python process of the run then sees a CUDA GPU (torch.cuda.is_available() is True) and ends,
printing benchmarks/common.py's DRY_RUN_MARK, at its first call that would initialise CUDA. A part
passes when all its processes got that far; pytest stops at the first test that touches the GPU,
after collecting every test file of the part.

    .venv/bin/python scripts/gpu_dry_run.py                    # both profiles
    .venv/bin/python scripts/gpu_dry_run.py --profile first
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from common import DRY_RUN_MARK  # noqa: E402

# Imported at start-up by the dry run's python3 (a .pth line), in its environment only.
HOOK = f'''"""torch sees one CUDA GPU; the first call that would initialise CUDA ends the process."""
import importlib.abc
import importlib.machinery
import os
import sys
import traceback


_STDERR = os.dup(2)  # the process's own stderr, before anything (pytest) captures descriptor 2


def _stop():
    frames = [f for f in traceback.extract_stack()[:-1] 
              if os.sep + "torch" + os.sep not in f.filename and f.filename != __file__]
    where = f"{{frames[-1].filename}}:{{frames[-1].lineno}}" if frames else "?"
    sys.stdout.flush()
    os.write(_STDERR, ("\\n{DRY_RUN_MARK} (from " + where + ")\\n").encode())
    os._exit(87)


def _cuda(module):
    module.is_available = lambda: True
    module.device_count = lambda: 1
    # Functions of their own (torch._dynamo refuses one function under two torch names).
    module._lazy_init = lambda *args, **kwargs: _stop()
    module.set_device = lambda *args, **kwargs: _stop()  # it reaches the driver without _lazy_init


def _c10d(module):
    init = module.init_process_group

    def init_process_group(backend=None, *args, **kwargs):
        if "nccl" in str(backend or ""):  # NCCL's process group asks the driver at once
            _stop()
        return init(backend, *args, **kwargs)
    module.init_process_group = init_process_group


class _Patch(importlib.abc.MetaPathFinder):
    """Patches these modules of torch right after they are executed (before anyone uses them)."""
    patches = {{"torch.cuda": _cuda, "torch.distributed.distributed_c10d": _c10d}}

    def find_spec(self, name, path, target=None):
        patch = self.patches.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            patch(module)
        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Patch())
'''


def carried() -> list[str]:
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), "--carry"],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def stage_tree(dest: str) -> None:
    """The tree as the GPU machine receives it, plus the extensions built here."""
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src):  # a tracked file deleted in the working tree is not sent
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel), follow_symlinks=False)
    for rel in carried():
        src = os.path.join(ROOT, rel)
        if not os.path.isdir(src):
            sys.exit(f"gpu_dry_run: {rel} is missing: scripts/bootstrap.sh makes it")
        shutil.copytree(src, os.path.join(dest, rel), symlinks=True)
    built = glob.glob(os.path.join(ROOT, "torch_ort", "_C*.so"))
    if not built:
        sys.exit("gpu_dry_run: torch_ort/_C*.so is missing: scripts/bootstrap.sh builds it")
    for so in built:
        shutil.copy2(so, os.path.join(dest, "torch_ort"))


def make_python(dest: str) -> str:
    """A python3 that sees this interpreter's packages (torch, ...) and nothing of torch_ort's."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", dest], check=True)
    site = subprocess.run([os.path.join(dest, "bin", "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    with open(os.path.join(site, "torch_ort_gpu_dry_run.py"), "w") as f:
        f.write(HOOK)
    with open(os.path.join(site, "gpu_machine.pth"), "w") as f:
        f.write("\n".join(ours) + "\nimport torch_ort_gpu_dry_run\n")
    return os.path.join(dest, "bin")


def environment(bin_dir: str, out_dir: str) -> tuple[dict, list[str]]:
    """The variables of the run, and the command prefix that takes the network away."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHON", "PYTHONSTARTUP",
                        "TORCH_ORT_GRPC_TOOLS_SDIST")}
    cache = os.path.join(os.path.dirname(out_dir), "cache")
    os.makedirs(cache, exist_ok=True)
    env.update(XDG_CACHE_HOME=cache, PATH=bin_dir + os.pathsep + env.get("PATH", ""), OUT=out_dir, TORCH_ORT_GPU_DRY_RUN="1",
               HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")
    for var, names in (("CXX", ("g++", "c++")), ("CC", ("gcc", "cc"))):
        found = next(filter(None, map(shutil.which, names)), None)
        if found:
            env[var] = os.path.realpath(found)
    # A network namespace of its own has only a loopback device (up: torchrun's rendezvous uses it).
    isolated = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
    if shutil.which("unshare") and shutil.which("ip") and subprocess.run(
            [*isolated, "true"], capture_output=True).returncode == 0:
        return env, isolated
    closed = "http://127.0.0.1:9"
    env.update(http_proxy=closed, https_proxy=closed, HTTP_PROXY=closed, HTTPS_PROXY=closed, no_proxy="",
               PIP_NO_INDEX="1")
    return env, []


def stage(work: str) -> tuple[str, dict, list[str]]:
    """(tree, env, prefix): the staged tree, and how to run a command there as the GPU machine would."""
    tree = os.path.join(work, "tree")
    stage_tree(tree)
    env, prefix = environment(make_python(os.path.join(work, "python")), os.path.join(work, "out"))
    return tree, env, prefix


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="first,second", help="comma list of gpu_check.sh profiles")
    args = parser.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="gpu_dry_run.") as work:
        tree, env, prefix = stage(work)
        print(f"[gpu_dry_run] tree staged; network: {'a namespace of its own' if prefix else 'proxies closed'}",
              flush=True)
        for profile in args.profile.split(","):
            rc = subprocess.run([*prefix, "bash", "scripts/gpu_check.sh", "--dry-run", "--profile", profile,
                                 "--budget", "1800"], cwd=tree, env=env).returncode
            with open(os.path.join(env["OUT"], "summary.md")) as f:
                print(f.read(), flush=True)
            if rc != 0:
                logs = os.path.join(env["OUT"], "logs.tar.gz")
                print(f"[gpu_dry_run] profile {profile} failed; its logs:", flush=True)
                subprocess.run(["tar", "-xzOf", logs], check=False)
                failed = 1
    return failed


if __name__ == "__main__":
    sys.exit(main())
