"""torch.profiler sees the engine: one range per node run, named torch_ort::<op type> (ATenOp and
ATenOpGrad with the ATen operator after it), inside the forward and the backward of the step."""
import torch
from torch.profiler import ProfilerActivity, profile

from torch_ort import ORTModule


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x))).logsumexp(-1).mean()


def test_each_engine_node_is_a_profiler_range():
    model = ORTModule(Net())
    x = torch.randn(8, 16)
    model(x).backward()  # export and build outside the profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(x).backward()
    events = [e for e in prof.events() if e.name.startswith("torch_ort::")]
    names = {e.name for e in events}
    assert {"torch_ort::Gemm", "torch_ort::BiasGelu", "torch_ort::BiasGeluGrad"} <= names, sorted(names)
    # logsumexp runs through the ATen fallback, forward and backward
    assert {"torch_ort::ATenOp aten::logsumexp.default", "torch_ort::ATenOpGrad aten::logsumexp.default"} <= names
    # The kernels' own ATen calls are children of their node's range.
    children = [c.name for e in events if e.name == "torch_ort::Gemm" for c in e.cpu_children]
    assert any(c.startswith("aten::") for c in children), children
    # Nothing is recorded without a profiler: the ranges cost a flag check.
    assert not torch.autograd.profiler._is_profiler_enabled
