"""Setting an attribute through ORTModule re-exports on the next call when the graph could depend
on it; an attribute no export read (a step counter set every step) never re-exports."""
import torch

from torch_ort import DebugOptions, LogLevel, ORTModule

INFO = DebugOptions(log_level=LogLevel.INFO)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.scale = 2.0     # read by forward: part of the graph
        self.step = 0        # never read by forward
        self.threshold = 10  # read by forward, but its value does not change the graph here

    def forward(self, x):
        h = self.fc(x) * self.scale
        if self.threshold > 100:
            h = h + 1
        return h.pow(2).mean()


def test_unread_attribute_set_every_step_never_reexports(strict):
    ours = ORTModule(Net())
    for i in range(10):
        ours.step = i
        ours(torch.randn(3, 4)).backward()
    assert ours.module.step == 9
    assert (ours.export_count, ours.engine_build_count) == (1, 1)


def test_read_attribute_reexports_and_changes_the_result(strict, torch_ort_log):
    torch.manual_seed(0)
    eager = Net()
    ours = ORTModule(Net(), INFO)
    ours.load_state_dict(eager.state_dict())
    x = torch.randn(3, 4)
    torch.testing.assert_close(ours(x), eager(x))
    ours.scale = 3.0
    eager.scale = 3.0
    torch.testing.assert_close(ours(x), eager(x))
    assert ours.export_count == 2
    assert any("graph changed" in r.getMessage() for r in torch_ort_log)


def test_read_attribute_with_same_graph_keeps_engines_and_says_so(strict, torch_ort_log):
    ours = ORTModule(Net(), INFO)
    ours(torch.randn(3, 4)).backward()
    ours.threshold = 11
    ours(torch.randn(3, 4)).backward()
    assert ours.export_count == 2 and ours.engine_build_count == 1
    assert any("same schema and graph; engines kept" in r.getMessage() for r in torch_ort_log)
    ours.threshold = 1000  # now the branch is taken: the graph must follow
    torch.testing.assert_close(ours(torch.zeros(1, 4)), ((ours.module.fc.bias * 2 + 1) ** 2).mean())


def test_skipcheck_disabled_reexports_every_assignment(strict, monkeypatch):
    monkeypatch.setenv("ORTMODULE_SKIPCHECK_POLICY", "SKIP_CHECK_DISABLED")
    ours = ORTModule(Net())
    for i in range(3):
        ours.step = i
        ours(torch.randn(3, 4)).backward()
    assert ours.export_count == 3 and ours.engine_build_count == 1


def test_replacing_a_submodule_trains_the_new_parameters(strict):
    ours = ORTModule(Net())
    ours(torch.randn(3, 4)).backward()
    new = torch.nn.Linear(4, 3)
    ours.fc = new
    assert ours.module.fc is new
    ours(torch.randn(3, 4)).backward()
    assert new.weight.grad is not None and ours.export_count == 2


def test_new_module_or_tensor_always_reexports(strict):
    """A module or tensor may join the graph without its name being read (nn.Sequential iterates
    _modules): those assignments re-export even when no export read the name."""
    ours = ORTModule(Net())
    ours(torch.randn(3, 4)).backward()
    ours.extra = torch.nn.Linear(2, 2)
    ours(torch.randn(3, 4)).backward()
    assert ours.export_count == 2
    ours.note = ("not", "read")  # any other value on an unread name: nothing to do
    ours(torch.randn(3, 4)).backward()
    assert ours.export_count == 2 and ours.module.note == ("not", "read")
