"""What this torch_ort installation is and whether it works: `python -m torch_ort` (or
`python -m torch_ort.configure`, the command ONNX Runtime's torch-ort users know).

It prints the versions that matter (torch_ort; torch running and torch compiled against; onnx,
onnxscript, onnx-ir; Python), whether the compiled extensions load (torch_ort._C, and
torch_ort._C_cuda where it was built), the CPU kernel path and the CUDA devices and architectures,
the ORTMODULE_* variables set in the environment as parsed, and then trains one small model for
two steps with fallback disabled, on the CPU and on a CUDA device where there is one, comparing
the loss and gradients with eager PyTorch. The exit status is 0 when everything works, 1 when
anything failed (each failure is printed with its reason). Nothing is downloaded or written.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import time
import traceback


class _Report:
    def __init__(self, out=sys.stdout):
        self.out = out
        self.failures: list[str] = []

    def line(self, label: str, value) -> None:
        print(f"{label:<28} {value}", file=self.out)

    def fail(self, label: str, error: BaseException | str) -> None:
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self.failures.append(f"{label}: {text}")
        self.line(label, f"FAILED: {text}")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _versions(r: _Report) -> None:
    import torch

    import torch_ort
    from torch_ort import _distribution, _extension

    r.line("torch_ort", f"{torch_ort.__version__} ({os.path.dirname(torch_ort.__file__)})")
    installed = _version(_distribution.NAME)
    r.line("distribution", f"{_distribution.NAME} {installed}" if installed != "not installed"
           else f"{_distribution.NAME} not installed (a source checkout on the path)")
    conflicting = _distribution.conflicting_version()
    if conflicting is not None:
        r.fail("conflicting distribution", f"{_distribution.CONFLICTING} {conflicting} installs the same "
               f"import package, torch_ort; remove it: {_distribution.FIX}")
    r.line("python", f"{platform.python_version()} ({sys.executable})")
    r.line("torch (running)", torch.__version__)
    r.line("torch (compiled against)", _extension.built_against() or "not recorded")
    for dist in ("onnx", "onnxscript", "onnx-ir", "transformers"):
        r.line(dist, _version(dist))
    try:
        _extension.check()
    except _extension.TorchVersionError as e:
        r.fail("torch version", e)


def _extensions(r: _Report) -> bool:
    import torch

    from torch_ort import _extension

    try:
        from torch_ort import _C
    except Exception as e:  # any load failure is the report's subject
        r.fail("torch_ort._C", e)
        return False
    r.line("torch_ort._C", f"loads ({_C.__file__})")
    r.line("CPU kernel path", _C.optim_cpu_path())
    r.line("CPU threads", torch.get_num_threads())
    if torch.cuda.is_available():
        names = ", ".join(f"{torch.cuda.get_device_name(i)} (sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})"
                          for i in range(torch.cuda.device_count()))
        r.line("CUDA devices", names)
        r.line("torch CUDA architectures", " ".join(torch.cuda.get_arch_list()))
    else:
        r.line("CUDA devices", "none")
    try:
        from torch_ort import _C_cuda
        archs = _extension.build_info("CUDA_ARCHS") or "not recorded"
        r.line("torch_ort._C_cuda", f"loads ({_C_cuda.__file__}); built for CUDA architectures {archs}")
    except ImportError as e:
        if torch.cuda.is_available():
            r.fail("torch_ort._C_cuda", e)
        else:
            r.line("torch_ort._C_cuda", f"not loaded ({e.__class__.__name__}); no CUDA device here")
    return True


def _settings(r: _Report) -> None:
    from torch_ort.ortmodule.policy.variables import VARIABLES, Settings

    try:
        settings = Settings.from_env()
    except Exception as e:  # an invalid value raises, naming the variable
        r.fail("ORTMODULE_* variables", e)
        return
    named = [v for v in VARIABLES if v.name in os.environ]
    if not named:
        r.line("ORTMODULE_* variables", "none set (defaults)")
    for v in named:
        value = settings.values[v.field]
        r.line(v.name, f"{os.environ[v.name]!r} -> {getattr(value, 'name', None) or value}")


def _train(r: _Report, device: str) -> None:
    """Two AdamW steps of a small MLP with cross-entropy through ORTModule, fallback disabled,
    against eager PyTorch."""
    import copy

    import torch

    from torch_ort import ORTModule

    label = f"training step ({device})"
    previous = os.environ.get("ORTMODULE_FALLBACK_POLICY")
    os.environ["ORTMODULE_FALLBACK_POLICY"] = "FALLBACK_DISABLE"
    try:
        torch.manual_seed(0)
        eager = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(device)
        ours = ORTModule(copy.deepcopy(eager))
        opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, ours)]
        start = time.perf_counter()
        for step in range(2):
            x = torch.randn(8, 16, device=device)
            y = torch.randint(0, 4, (8,), device=device)
            losses = []
            for m, opt in zip((eager, ours), opts):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(m(x), y)
                loss.backward()
                losses.append(loss.detach())
            torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-6)
            for pe, po in zip(eager.parameters(), ours.parameters()):
                torch.testing.assert_close(po.grad, pe.grad, rtol=1e-3, atol=1e-5)
            for opt in opts:
                opt.step()
        if ours.fallback is not None:
            raise RuntimeError(f"ran in eager PyTorch: {ours.fallback.reason}")
        r.line(label, f"ok: loss and gradients match eager over 2 AdamW steps ({time.perf_counter() - start:.1f} s, "
                      f"export included)")
    except Exception as e:  # the report's subject
        r.fail(label, e)
        if os.environ.get("TORCH_ORT_CONFIGURE_TRACEBACK"):
            traceback.print_exc()
    finally:
        if previous is None:
            os.environ.pop("ORTMODULE_FALLBACK_POLICY", None)
        else:
            os.environ["ORTMODULE_FALLBACK_POLICY"] = previous


def main(argv: list[str] | None = None) -> int:
    """Prints the report; 0 when everything works, 1 otherwise."""
    r = _Report()
    try:
        _versions(r)
    except Exception as e:  # torch or torch_ort itself does not import
        r.fail("imports", e)
        return 1
    if _extensions(r):
        _settings(r)
        _train(r, "cpu")
        import torch
        if torch.cuda.is_available():
            _train(r, "cuda")
    if r.failures:
        print(f"\ntorch_ort does not work here: {len(r.failures)} failure(s) above "
              "(TORCH_ORT_CONFIGURE_TRACEBACK=1 prints the tracebacks).", file=r.out)
        return 1
    print("\ntorch_ort works here.", file=r.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
