"""torch_ort logs as a library: records go to the `torch_ort` logger (a NullHandler, propagation
on) and reach whatever handlers the application configured; levels are set on that logger only
when asked for, and the root logger is never touched. Also DEVINFO and DebugOptions(config=...)."""
import logging
import pathlib
import re
import warnings

import pytest
import torch

import torch_ort
from torch_ort import DebugOptions, LogLevel, ORTModule
from torch_ort.ortmodule.policy import debug_options
from torch_ort.ortmodule.policy.debug_options import LOGGER, RANK_FILTER

PACKAGE = pathlib.Path(debug_options.__file__).parents[1]


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x).relu().sum()


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def root_configured():
    """The root logger as `logging.basicConfig(level=INFO)` leaves it in a fresh application: one
    fresh handler (pytest's own are set aside and put back after)."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers = []
    handler = Collect()
    logging.basicConfig(handlers=[handler], level=logging.INFO)
    try:
        yield handler
    finally:
        root.handlers = saved_handlers
        root.setLevel(saved_level)


def test_the_logger_is_a_librarys(monkeypatch):
    monkeypatch.delenv("ORTMODULE_LOG_LEVEL", raising=False)
    assert [type(h) for h in LOGGER.handlers] == [logging.NullHandler] and LOGGER.propagate
    level = LOGGER.level
    ORTModule(Small())  # no level asked for: the logger's level is left as it was
    assert LOGGER.level == level and LOGGER.propagate
    assert [type(h) for h in LOGGER.handlers] == [logging.NullHandler]


def test_basic_config_handlers_receive_torch_orts_records(monkeypatch, root_configured):
    monkeypatch.delenv("ORTMODULE_LOG_LEVEL", raising=False)
    LOGGER.setLevel(logging.NOTSET)  # the application's root level (INFO) governs
    ORTModule(Small())(torch.randn(2, 4)).backward()
    said = [r for r in root_configured.records if r.name == "torch_ort"]
    assert any(r.levelno == logging.INFO and "exported Small" in r.getMessage() for r in said), \
        [r.getMessage() for r in said]


def test_a_level_asked_for_is_set_on_torch_orts_logger_only(monkeypatch, root_configured):
    monkeypatch.delenv("ORTMODULE_LOG_LEVEL", raising=False)
    root = logging.getLogger()
    handlers = root.handlers[:]  # the configured one (and pytest's capture, added for the call)
    ORTModule(Small(), DebugOptions(log_level=LogLevel.VERBOSE))(torch.randn(2, 4))
    assert LOGGER.level == logging.DEBUG and root.level == logging.INFO
    assert root.handlers == handlers and root_configured in handlers
    LOGGER.debug("a VERBOSE record")
    assert "a VERBOSE record" in [r.getMessage() for r in root_configured.records]  # below root's level
    monkeypatch.setenv("ORTMODULE_LOG_LEVEL", "ERROR")
    ORTModule(Small())
    assert LOGGER.level == logging.ERROR and root.level == logging.INFO


# What would touch the root logger or another library's handlers: configuring logging, the
# root logger by any name, module-level logging.info(...) (which may call basicConfig), turning
# propagation off, adding a handler other than the NullHandler.
ROOT_TOUCHES = re.compile(
    r"logging\.basicConfig\(|getLogger\(\s*(\)|None|['\"]['\"]|['\"]root['\"])|logging\.root\b|"
    r"logging\.(debug|info|warning|warn|error|critical|exception|log|disable)\(|"
    r"\.propagate\s*=|addHandler\((?!logging\.NullHandler\(\))|fileConfig\(|dictConfig\(")


def test_no_torch_ort_code_touches_the_root_logger():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 10
    found = [f"{p.relative_to(PACKAGE)}:{n}: {line.strip()}" for p in files
             for n, line in enumerate(p.read_text().splitlines(), 1) if ROOT_TOUCHES.search(line)]
    assert not found, found


def test_other_ranks_keep_quiet_through_a_filter_on_our_logger(monkeypatch, root_configured):
    monkeypatch.delenv("ORTMODULE_LOG_LEVEL", raising=False)
    monkeypatch.setenv("RANK", "1")
    assert RANK_FILTER in LOGGER.filters
    ORTModule(Small(), DebugOptions(log_level=LogLevel.INFO))
    LOGGER.info("info on rank 1")
    LOGGER.error("error on rank 1")
    said = [r.getMessage() for r in root_configured.records if r.name == "torch_ort"]
    assert said == ["error on rank 1"], said
    ORTModule(Small(), DebugOptions(log_level=LogLevel.DEVINFO))   # below INFO: every rank speaks
    LOGGER.info("devinfo on rank 1")
    assert "devinfo on rank 1" in [r.getMessage() for r in root_configured.records]


@pytest.mark.parametrize("text", ["DEVINFO", "devinfo"])
def test_devinfo_is_info_on_every_rank(monkeypatch, text):
    """ONNX Runtime 1.19's DEVINFO (for its developers): INFO messages, on all ranks."""
    assert LogLevel.VERBOSE < LogLevel.DEVINFO < LogLevel.INFO
    monkeypatch.setenv("ORTMODULE_LOG_LEVEL", text)
    assert DebugOptions(log_level=LogLevel.ERROR).log_level is LogLevel.DEVINFO
    monkeypatch.setenv("RANK", "1")
    ORTModule(Small())
    assert LOGGER.level == logging.INFO and RANK_FILTER.every_rank


def test_debug_options_config_is_accepted_and_said_to_have_no_effect(monkeypatch, torch_ort_log):
    """ONNX Runtime 1.19's DebugOptions takes `config` (fifth, after save_path) and reads it nowhere."""
    monkeypatch.setattr(debug_options, "_config_told", False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert DebugOptions(config=None).config is None
        assert not record
        positional = DebugOptions(LogLevel.INFO, False, "", "", {"any": "thing"})
        assert positional.config == {"any": "thing"}
        DebugOptions(config="x")
    told = [str(w.message) for w in record if issubclass(w.category, torch_ort.ConfigurationWarning)]
    assert len(told) == 1 and "has no effect" in told[0] and told[0].startswith("DebugOptions(config=dict)")
    assert not torch_ort_log  # a warning, not a log record too


class WarnsInForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        warnings.warn("a warning of the model's own code", UserWarning)
        return self.fc(x).sum()


def test_export_keeps_the_models_warnings_and_the_users_logger_levels(strict):
    """The export quiets torch's, onnx's and onnxscript's own warnings and loggers, within the
    export only: a warning the model's code issues still shows, a level the user set on one of
    those loggers stays theirs, and every level is as it was afterwards."""
    onnx_logger = logging.getLogger("torch.onnx")
    export_logger = logging.getLogger("torch.export")
    before = export_logger.level
    onnx_logger.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            ORTModule(WarnsInForward())(torch.randn(3, 4)).backward()
        assert any("a warning of the model's own code" in str(w.message) for w in record)
        assert onnx_logger.level == logging.INFO and export_logger.level == before
    finally:
        onnx_logger.setLevel(logging.NOTSET)
