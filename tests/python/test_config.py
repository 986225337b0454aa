"""Every ORTMODULE_* variable and DebugOptions field: one test showing its effect, and invalid
values refused with the valid ones listed. (Fallback flags: test_fallback_policy.py; custom
autograd: test_python_op.py; checkpoint: test_checkpoint.py; ATen fallback: test_bad_input.py.)"""
import logging
import os
import warnings

import onnx
import pytest
import torch

from torch_ort import ConfigurationWarning, DebugOptions, LogLevel, ORTModule
from torch_ort.ortmodule.policy.variables import VARIABLES, RecomputePlan, Settings

ORT_NAMES = {  # ../shared/ORT_REFERENCE.md's table
    "ORTMODULE_ONNX_OPSET_VERSION", "ORTMODULE_FALLBACK_POLICY", "ORTMODULE_FALLBACK_RETRY",
    "ORTMODULE_LOG_LEVEL", "ORTMODULE_SAVE_ONNX_PATH", "ORTMODULE_ENABLE_CUSTOM_AUTOGRAD",
    "ORTMODULE_DISABLE_CUSTOM_AUTOGRAD_SUPPORT", "ORTMODULE_ALLOW_AUTOGRAD_CHECKPOINT",
    "ORTMODULE_SKIPPED_AUTOGRAD_FUNCTIONS", "ORTMODULE_MEMORY_OPT_LEVEL", "ORTMODULE_MEMORY_OPT_CONFIG",
    "ORTMODULE_PRINT_MEMORY_STATS", "ORTMODULE_CACHE_DIR", "ORTMODULE_DEEPCOPY_BEFORE_MODEL_EXPORT",
    "ORTMODULE_SKIPCHECK_POLICY", "ORTMODULE_ENABLE_COMPUTE_OPTIMIZER", "ORTMODULE_USE_EFFICIENT_ATTENTION",
}


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1   # Python state the export must not touch when it runs on a copy
        return self.fc(x).pow(2).mean()


def messages(records, level=logging.DEBUG):
    return [r.getMessage() for r in records if r.levelno >= level]


def test_table_covers_every_ort_variable():
    assert ORT_NAMES <= {v.name for v in VARIABLES}
    for v in VARIABLES:
        assert v.help and v.type and v.field


INVALID = {
    "ORTMODULE_ONNX_OPSET_VERSION": ("eighteen", "opset number"),
    "ORTMODULE_FALLBACK_POLICY": ("FALLBACK_MAYBE", "FALLBACK_UNSUPPORTED_DATA"),
    "ORTMODULE_FALLBACK_RETRY": ("sometimes", "true, on, yes, 0"),
    "ORTMODULE_LOG_LEVEL": ("LOUD", "VERBOSE, DEVINFO, INFO, WARNING, ERROR, FATAL"),
    "ORTMODULE_ENABLE_CUSTOM_AUTOGRAD": ("2", "use one of 1, true"),
    "ORTMODULE_DISABLE_CUSTOM_AUTOGRAD_SUPPORT": ("maybe", "use one of"),
    "ORTMODULE_ALLOW_AUTOGRAD_CHECKPOINT": ("y", "use one of"),
    "ORTMODULE_SKIPPED_AUTOGRAD_FUNCTIONS": ("my-module.Fn", "fully qualified"),
    "ORTMODULE_MEMORY_OPT_LEVEL": ("3", "0 .user config only"),
    "ORTMODULE_MEMORY_OPT_CONFIG": ("Gelu+:7:1", "<cluster id>:<strategy 0/1/2>"),
    "ORTMODULE_PRINT_MEMORY_STATS": ("loud", "use one of"),
    "ORTMODULE_DEEPCOPY_BEFORE_MODEL_EXPORT": ("deep", "use one of"),
    "ORTMODULE_SKIPCHECK_POLICY": ("SKIP_CHECK_NOTHING", "SKIP_CHECK_DISABLED"),
    "ORTMODULE_ENABLE_COMPUTE_OPTIMIZER": ("fast", "use one of"),
    "ORTMODULE_USE_EFFICIENT_ATTENTION": ("flash", "use one of"),
    "ORTMODULE_ATEN_FALLBACK": ("never", "use one of"),
    "ORTMODULE_DISABLED_PASSES": ("dce,no_such_pass", "'no_such_pass' is not a graph pass; passes: .*dce"),
    "ORTMODULE_DISABLED_PASSES ": ("sequence_to_split", "lowering the engine needs and cannot be disabled"),
    "ORTMODULE_GRADIENT_RELEASE": ("lots", "a size in MiB"),
    "ORTMODULE_GRADIENT_RELEASE ": ("inf", "a size in MiB"),
    "ORTMODULE_MAX_CACHED_GRAPHS": ("-1", "a whole number such as 16"),
    "ORTMODULE_MAX_CACHED_GRAPHS ": ("many", "0: no bound"),
}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_value_names_the_variable_and_the_valid_values(monkeypatch, name):
    text, valid = INVALID[name]
    name = name.strip()  # a trailing space keys a second case of one variable
    monkeypatch.setenv(name, text)
    with pytest.raises(ValueError, match=name) as info:
        ORTModule(Small())
    import re
    assert re.search(valid, str(info.value)), str(info.value)


def test_defaults_when_unset():
    s = Settings.from_env({})
    assert s.opset is None and s.fallback_retry is False and s.custom_autograd is True
    assert s.allow_checkpoint is False and s.deepcopy_before_export is True
    assert s.memory_opt_level == 0 and s.memory_opt_config == () and s.cache_dir is None


def test_opset_version_reaches_the_exported_file(monkeypatch, tmp_path):
    monkeypatch.setenv("ORTMODULE_ONNX_OPSET_VERSION", "18")
    monkeypatch.setenv("ORTMODULE_SAVE_ONNX_PATH", str(tmp_path))
    ours = ORTModule(Small(), DebugOptions(save_onnx=True, onnx_prefix="m"))
    ours(torch.randn(2, 4)).backward()
    model = onnx.load(str(tmp_path / "m_torch_exported_training.onnx"))
    assert {o.domain: o.version for o in model.opset_import}[""] == 18


def test_save_onnx_path_holds_the_files(monkeypatch, tmp_path):
    target = tmp_path / "graphs"
    monkeypatch.setenv("ORTMODULE_SAVE_ONNX_PATH", str(target))
    monkeypatch.chdir(tmp_path)
    ORTModule(Small(), DebugOptions(save_onnx=True, onnx_prefix="p"))(torch.randn(2, 4)).backward()
    assert sorted(p.name for p in target.iterdir()) == [
        "p_execution_model_training.onnx", "p_optimized_pre_grad_training.onnx",
        "p_torch_exported_training.onnx"]
    assert not list(tmp_path.glob("p_*.onnx"))


def test_debug_options_fields(tmp_path, monkeypatch, torch_ort_log):
    monkeypatch.chdir(tmp_path)
    ORTModule(Small(), DebugOptions(save_onnx=False, onnx_prefix="q"))(torch.randn(2, 4))
    assert not list(tmp_path.glob("*.onnx"))          # save_onnx=False writes nothing
    with pytest.raises(ValueError, match="onnx_prefix"):
        DebugOptions(save_onnx=True)
    with pytest.raises(TypeError, match="LogLevel"):
        DebugOptions(log_level="INFO")
    ORTModule(Small(), DebugOptions(log_level=LogLevel.INFO))(torch.randn(2, 4))
    assert any("exported Small" in m for m in messages(torch_ort_log, logging.INFO))
    torch_ort_log.clear()
    ORTModule(Small(), DebugOptions(log_level=LogLevel.WARNING))(torch.randn(2, 4))
    assert not any("exported Small" in m for m in messages(torch_ort_log))  # silenced at WARNING


# Each wrong DebugOptions argument and what it raises. ONNX Runtime raises TypeError for a
# non-LogLevel log_level, and for a non-str onnx_prefix when save_onnx is set; we check every
# argument's type whatever save_onnx is (docs/migration.md).
BAD_DEBUG_OPTIONS = [
    (dict(save_onnx=True, onnx_prefix=23), TypeError, "onnx_prefix must be a str"),
    (dict(onnx_prefix=23), TypeError, "onnx_prefix must be a str"),
    (dict(save_onnx="no", onnx_prefix="m"), TypeError, "save_onnx must be True or False"),
    (dict(save_onnx=1, onnx_prefix="m"), TypeError, "save_onnx must be True or False"),
    (dict(log_level="INFO"), TypeError, "log_level must be a LogLevel.*use LogLevel.INFO"),
    (dict(log_level=1), TypeError, "log_level must be a LogLevel"),
    (dict(save_path=7), TypeError, "save_path must be a str"),
    (dict(save_onnx=True), ValueError, "needs an onnx_prefix"),
    (dict(save_onnx=True, onnx_prefix=""), ValueError, "needs an onnx_prefix"),
]


@pytest.mark.parametrize("kwargs,error,message", BAD_DEBUG_OPTIONS, ids=lambda x: str(x))
def test_debug_options_refuses_a_wrong_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        DebugOptions(**kwargs)


def test_debug_options_refuses_a_directory_it_cannot_write(monkeypatch, tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    monkeypatch.setenv("ORTMODULE_SAVE_ONNX_PATH", str(not_a_dir / "graphs"))
    with pytest.raises(OSError, match="is not a directory.*ORTMODULE_SAVE_ONNX_PATH"):
        DebugOptions(save_onnx=True, onnx_prefix="m")
    DebugOptions(save_onnx=False)  # nothing is written: nothing to check
    monkeypatch.setenv("ORTMODULE_SAVE_ONNX_PATH", str(tmp_path / "new" / "graphs"))
    assert DebugOptions(save_onnx=True, onnx_prefix="m").save_dir == str(tmp_path / "new" / "graphs")


def test_debug_options_accepts_onnx_runtimes_forms(monkeypatch, tmp_path):
    monkeypatch.delenv("ORTMODULE_SAVE_ONNX_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    positional = DebugOptions(LogLevel.INFO, True, "m")  # ORT's argument order
    assert (positional.log_level, positional.save_onnx, positional.onnx_prefix) == (LogLevel.INFO, True, "m")
    assert positional.save_dir == str(tmp_path)
    elsewhere = tmp_path / "chosen"
    assert DebugOptions(save_onnx=True, onnx_prefix="m", save_path=str(elsewhere)).save_dir == str(elsewhere)
    monkeypatch.setenv("ORTMODULE_SAVE_ONNX_PATH", str(tmp_path / "env"))  # the variable wins
    assert DebugOptions(save_onnx=True, onnx_prefix="m", save_path=str(elsewhere)).save_dir == \
        str(tmp_path / "env")
    assert DebugOptions(log_level=LogLevel.FATAL, save_onnx=False, onnx_prefix="").log_level == LogLevel.FATAL


def saved_files(target):
    return sorted(p.name for p in target.iterdir())


def test_save_onnx_uses_onnx_runtimes_file_names_per_mode(monkeypatch, tmp_path):
    """{prefix}_{stage}_{mode}.onnx with ORT's stage names; the mode is said once, `training` for
    an engine with gradients and `inference` for a forward-only one."""
    monkeypatch.setenv("ORTMODULE_SAVE_ONNX_PATH", str(tmp_path / "train"))
    ORTModule(Small(), DebugOptions(save_onnx=True, onnx_prefix="p"))(torch.randn(2, 4)).backward()
    assert saved_files(tmp_path / "train") == [
        "p_execution_model_training.onnx", "p_optimized_pre_grad_training.onnx",
        "p_torch_exported_training.onnx"]
    run = onnx.load(str(tmp_path / "train" / "p_execution_model_training.onnx")).graph
    pre_grad = onnx.load(str(tmp_path / "train" / "p_optimized_pre_grad_training.onnx")).graph
    assert any(n.op_type.endswith("Grad") for n in run.node)          # forward + backward
    assert not any(n.op_type.endswith("Grad") for n in pre_grad.node)  # before autodiff

    monkeypatch.setenv("ORTMODULE_SAVE_ONNX_PATH", str(tmp_path / "eval"))
    model = ORTModule(Small().eval(), DebugOptions(save_onnx=True, onnx_prefix="p"))
    with torch.no_grad():
        model(torch.randn(2, 4))
    assert saved_files(tmp_path / "eval") == ["p_execution_model_inference.onnx",
                                              "p_torch_exported_inference.onnx"]
    run = onnx.load(str(tmp_path / "eval" / "p_execution_model_inference.onnx")).graph
    assert not any(n.op_type.endswith("Grad") for n in run.node)

    # A training-mode module called without gradients runs a forward-only engine: its files say
    # inference (as ORT, whose inference manager runs it) and leave the training ones alone.
    monkeypatch.setenv("ORTMODULE_SAVE_ONNX_PATH", str(tmp_path / "both"))
    model = ORTModule(Small(), DebugOptions(save_onnx=True, onnx_prefix="p"))
    model(torch.randn(2, 4)).backward()
    with torch.no_grad():
        model(torch.randn(2, 4))
    assert saved_files(tmp_path / "both") == [
        "p_execution_model_inference.onnx", "p_execution_model_training.onnx",
        "p_optimized_pre_grad_training.onnx", "p_torch_exported_inference.onnx",
        "p_torch_exported_training.onnx"]
    run = onnx.load(str(tmp_path / "both" / "p_execution_model_training.onnx")).graph
    assert any(n.op_type.endswith("Grad") for n in run.node)


def _told(record, needle):
    return [str(w.message) for w in record if issubclass(w.category, ConfigurationWarning) and needle in str(w.message)]


def test_onnx_runtime_variables_we_do_not_read_say_so_once(monkeypatch):
    from torch_ort.ortmodule.policy import variables
    monkeypatch.setattr(variables, "_told", set())
    assert not {v.name for v in variables.ORT_ONLY} & {v.name for v in VARIABLES}
    monkeypatch.setenv("ORTMODULE_PRINT_INPUT_DENSITY", "1")
    monkeypatch.setenv("ORTMODULE_CONV_ALGO_SEARCH", "HEURISTIC")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            ORTModule(Small())(torch.randn(2, 4))
    told = _told(record, "has no effect in torch_ort")
    assert len(told) == 2, told  # one warning per variable, not per module
    assert any(m.startswith("ORTMODULE_PRINT_INPUT_DENSITY is ONNX Runtime's") and "ignore_index" in m
               for m in told)


def test_every_onnx_runtime_variable_is_ours_or_said_to_have_no_effect():
    """ONNX Runtime 1.19's ORTMODULE_* names (its guidelines page, options.py and the other
    os.getenv/_defined_from_envvar calls of its ortmodule package), each in one of the tables."""
    from torch_ort.ortmodule.policy.variables import ORT_ONLY
    ort_1_19 = ORT_NAMES | {
        "ORTMODULE_PRINT_INPUT_DENSITY", "ORTMODULE_ENABLE_SPARSE_OPTIMIZER",
        "ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER", "ORTMODULE_CONV_ALGO_SEARCH",
        "ORTMODULE_MEMORY_OPT_PROBE_RECOMPUTE_LEVEL", "ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT",
        "ORTMODULE_ENABLE_ZERO_STAGE3", "ORTMODULE_USE_TRITON", "ORTMODULE_TRITON_CONFIG_FILE",
        "ORTMODULE_TRITON_DEBUG", "ORTMODULE_ENABLE_TUNING", "ORTMODULE_MAX_TUNING_DURATION_MS",
        "ORTMODULE_TUNING_RESULTS_PATH", "ORTMODULE_USE_FLASH_ATTENTION"}
    assert ort_1_19 <= {v.name for v in VARIABLES} | {v.name for v in ORT_ONLY}


def test_an_onnx_runtime_only_variable_warns_once_saying_why(monkeypatch):
    from torch_ort.ortmodule.policy import variables
    monkeypatch.setattr(variables, "_told", set())
    monkeypatch.setenv("ORTMODULE_USE_TRITON", "1")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            Settings.from_env()
    told = _told(record, "ORTMODULE_USE_TRITON")
    assert len(told) == 1 and "has no effect in torch_ort" in told[0] and "Triton" in told[0], told


def test_a_misspelled_variable_warns_once_with_the_closest_name(monkeypatch):
    from torch_ort.ortmodule.policy import variables
    monkeypatch.setattr(variables, "_told", set())
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_LVL", "1")
    monkeypatch.setenv("ORTMODULE_ZZZ", "1")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            ORTModule(Small())
    told = _told(record, "is not a torch_ort or ONNX")
    assert len(told) == 2, told
    assert any(m.startswith("ORTMODULE_MEMORY_OPT_LVL ") and "did you mean ORTMODULE_MEMORY_OPT_LEVEL?" in m
               for m in told), told
    assert any(m.startswith("ORTMODULE_ZZZ ") and "docs/configuration.md" in m for m in told), told


def test_a_misspelled_variable_is_seen_with_default_settings(tmp_path):
    """No logging configured, Python's default warning filters: the user sees it on stderr."""
    import subprocess
    import sys
    env = {**os.environ, "ORTMODULE_MEMORY_OPT_LVL": "1"}
    env.pop("PYTHONWARNINGS", None)
    code = "import torch, torch_ort; torch_ort.ORTModule(torch.nn.Linear(2, 2))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ConfigurationWarning: ORTMODULE_MEMORY_OPT_LVL is not a torch_ort or ONNX Runtime variable" in done.stderr
    assert "did you mean ORTMODULE_MEMORY_OPT_LEVEL?" in done.stderr


def record(level):
    return logging.LogRecord("torch_ort", level, __file__, 0, "m", (), None)


def test_log_level_env_overrides_and_quiets_other_ranks(monkeypatch):
    from torch_ort.ortmodule.policy.debug_options import RANK_FILTER
    logger = logging.getLogger("torch_ort")
    monkeypatch.setenv("ORTMODULE_LOG_LEVEL", "INFO")
    ORTModule(Small(), DebugOptions(log_level=LogLevel.ERROR))
    assert logger.getEffectiveLevel() == logging.INFO
    assert RANK_FILTER.filter(record(logging.INFO))
    monkeypatch.setenv("RANK", "1")   # other ranks: only errors pass the filter
    ORTModule(Small(), DebugOptions(log_level=LogLevel.ERROR))
    assert not RANK_FILTER.filter(record(logging.WARNING)) and RANK_FILTER.filter(record(logging.ERROR))
    monkeypatch.setenv("ORTMODULE_LOG_LEVEL", "VERBOSE")   # VERBOSE: every rank speaks
    ORTModule(Small())
    assert logger.getEffectiveLevel() == logging.DEBUG and RANK_FILTER.filter(record(logging.DEBUG))


def test_print_memory_stats(monkeypatch, torch_ort_log):
    monkeypatch.setenv("ORTMODULE_PRINT_MEMORY_STATS", "1")
    ours = ORTModule(Small())
    for _ in range(2):
        ours(torch.randn(2, 4)).backward()
    lines = [m for m in messages(torch_ort_log) if m.startswith("[memory]")]
    phases = [m.split(":")[0].split(" ", 3)[3] for m in lines]
    assert phases == ["pre-forward", "post-forward", "pre-backward", "post-backward"] * 2, lines
    assert "step 2" in lines[-1] and "rss" in lines[-1]
    monkeypatch.delenv("ORTMODULE_PRINT_MEMORY_STATS")
    quiet = ORTModule(Small())
    torch_ort_log.clear()
    quiet(torch.randn(2, 4)).backward()
    assert not [m for m in messages(torch_ort_log) if m.startswith("[memory]")]


SEEN_SELF = []


class RecordsSelf(Small):
    def forward(self, x):
        SEEN_SELF.append(id(self))  # state outside the module, which torch.export does not restore
        return super().forward(x)


@pytest.mark.parametrize("value, traced_original", [("1", False), ("0", True)])
def test_deepcopy_before_export_traces_a_copy(monkeypatch, value, traced_original):
    """torch.export (2.15) already restores the module's own attributes after tracing
    (model.calls stays 0 either way); the copy also keeps the original out of the trace."""
    monkeypatch.setenv("ORTMODULE_DEEPCOPY_BEFORE_MODEL_EXPORT", value)
    SEEN_SELF.clear()
    model = RecordsSelf()
    ours = ORTModule(model)
    ours(torch.randn(2, 4)).backward()
    assert SEEN_SELF and (id(model) in SEEN_SELF) == traced_original
    assert model.calls == 0
    assert model.fc.weight.grad is not None  # parameters are shared with the copy, not copied


@pytest.mark.parametrize("name, value, parsed", [
    ("ORTMODULE_MEMORY_OPT_LEVEL", "1", 1),
    ("ORTMODULE_MEMORY_OPT_CONFIG", "Gelu+:1:-1,Dropout+:2:3",
     (RecomputePlan("Gelu+", 1, -1), RecomputePlan("Dropout+", 2, 3))),
])
def test_memory_variables_are_parsed_and_acted_on(monkeypatch, torch_ort_log, name, value, parsed):
    monkeypatch.setenv(name, value)
    field = next(v.field for v in VARIABLES if v.name == name)
    ours = ORTModule(Small())
    assert getattr(ours._settings, field) == parsed
    assert not any(name in m for m in messages(torch_ort_log, logging.WARNING))


@pytest.mark.parametrize("name, value, field, parsed", [
    ("ORTMODULE_ENABLE_COMPUTE_OPTIMIZER", "0", "compute_optimizer", False),
    ("ORTMODULE_ENABLE_SPARSE_OPTIMIZER", "1", "sparse_optimizer", True),
    ("ORTMODULE_ENABLE_SPARSE_OPTIMIZER", "auto", "sparse_optimizer", "auto"),
])
def test_compute_optimizer_variables_are_parsed_and_acted_on(monkeypatch, torch_ort_log, name, value, field,
                                                             parsed):
    """Acted on: tests/python/test_label_sparsity.py shows each switching the rewrite off."""
    monkeypatch.setenv(name, value)
    ours = ORTModule(Small())
    assert getattr(ours._settings, field) == parsed
    assert not any(name in m for m in messages(torch_ort_log, logging.WARNING))


def test_sparse_optimizer_rejects_other_values(monkeypatch):
    monkeypatch.setenv("ORTMODULE_ENABLE_SPARSE_OPTIMIZER", "sometimes")
    with pytest.raises(ValueError, match="ORTMODULE_ENABLE_SPARSE_OPTIMIZER"):
        ORTModule(Small())


def test_memory_opt_config_from_json_file(monkeypatch, tmp_path):
    path = tmp_path / "plans.json"
    path.write_text('{"Recompute": ["Gelu+:1:-1"]}')
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_CONFIG", str(path))
    assert ORTModule(Small())._settings.memory_opt_config == (RecomputePlan("Gelu+", 1, -1),)


@pytest.mark.parametrize("policy, checked", [("SKIP_CHECK_DISABLED", True), ("", False)])
def test_skipcheck_policy_device_check_per_call(monkeypatch, policy, checked):
    from torch_ort.ortmodule import ORTModuleDeviceException

    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    monkeypatch.setenv("ORTMODULE_SKIPCHECK_POLICY", policy)
    ours = ORTModule(Small())
    ours(torch.randn(2, 4)).backward()
    ours.module.to("meta")  # the parameters move after the engine was built
    if checked:
        with pytest.raises(ORTModuleDeviceException, match="meta"):
            ours(torch.randn(2, 4))
    else:  # not re-checked by ORTModule: the engine meets the meta parameters and says so
        with pytest.raises(TypeError, match="'fc.weight' is on meta"):
            ours(torch.randn(2, 4))



# padding_elimination is off unless ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER=1 asks for it.
@pytest.mark.parametrize("env, off", [({}, {"padding_elimination"}),
                                      ({"ORTMODULE_DISABLED_PASSES": "dce"}, {"dce", "padding_elimination"}),
                                      ({"ORTMODULE_USE_EFFICIENT_ATTENTION": "0"},
                                       {"attention_fusion", "padding_elimination"}),
                                      ({"ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER": "1"}, set())])
def test_disabled_passes_reach_the_engine(monkeypatch, env, off):
    import torch_ort
    from torch_ort import _C
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    built = []
    real = _C.Engine

    def spy(onnx_bytes, training, flags, disabled_passes=(), *memory):
        built.append(sorted(disabled_passes))
        return real(onnx_bytes, training, flags, disabled_passes, *memory)
    monkeypatch.setattr(_C, "Engine", spy)
    ORTModule(Small())(torch.randn(2, 4)).backward()
    assert built == [sorted(off & set(torch_ort.pass_names()))]
