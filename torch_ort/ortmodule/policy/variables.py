"""Every ORTMODULE_* environment variable in one table: name, type, default, parser, help.

ORTModule reads the table once, when it is constructed (`Settings.from_env()`); an invalid value
raises a ValueError that names the variable and lists the valid values. Variables whose effect
belongs to a later stage (memory optimizer, compute optimizer, efficient attention) are parsed and
validated here, and the stage reads them from the same Settings. ONNX Runtime 1.19's variables
that we do not read are in a second table, ORT_ONLY: setting one logs, once, that it has no effect
here and why. Any other ORTMODULE_* name in the environment (a typo) logs, once, the closest valid
name.
"""
from __future__ import annotations

import difflib
import os
import warnings
from dataclasses import dataclass
from typing import Callable

from torch_ort.ortmodule.policy import value_types as parse
from torch_ort.ortmodule.policy.debug_options import ConfigurationWarning
from torch_ort.ortmodule.policy.fallback_policy import DEFAULT_POLICY
from torch_ort.ortmodule.policy.value_types import DEFAULT_SKIPCHECK, RecomputePlan, SkipCheck  # noqa: F401  (re-exported)

@dataclass(frozen=True)
class Variable:
    name: str                              # the environment variable
    field: str                             # the Settings attribute it fills
    type: str                              # as the user writes it (for docs and errors)
    default: object                        # the value when unset or empty
    parse: Callable[[str, str], object]    # (name, text) -> value; raises ValueError naming both
    help: str                              # one line for the docs


VARIABLES: tuple[Variable, ...] = (
    Variable("ORTMODULE_ONNX_OPSET_VERSION", "opset", "int", None, parse.opset,
             "ONNX opset used for export (default: the exporter's)"),
    Variable("ORTMODULE_FALLBACK_POLICY", "fallback_policy", "flags", DEFAULT_POLICY, parse.policy,
             "which failures run the module in eager PyTorch (FALLBACK_* joined by '|')"),
    Variable("ORTMODULE_FALLBACK_RETRY", "fallback_retry", "bool", False, parse.boolean,
             "after a fallback, try the engine again on every call"),
    Variable("ORTMODULE_PARTIAL_ACCELERATION", "partial_acceleration", "bool", True, parse.boolean,
             "when the module cannot run in the engine as a whole (a FALLBACK_UNSUPPORTED_* kind the "
             "policy lets fall back), run its forward eagerly and its largest submodules that can in "
             "the engine (0: the whole module runs eagerly)"),
    Variable("ORTMODULE_LOG_LEVEL", "log_level", "VERBOSE|DEVINFO|INFO|WARNING|ERROR|FATAL", None,
             parse.log_level, "sets the torch_ort logger's level, overriding DebugOptions.log_level (unset and "
             "no log_level: the level is left to the application); ranks other than 0 log errors "
             "only, unless VERBOSE or DEVINFO (DEVINFO is INFO on every rank)"),
    Variable("ORTMODULE_SAVE_ONNX_PATH", "save_onnx_path", "path", None, parse.path,
             "directory DebugOptions(save_onnx=True) writes to, read when the DebugOptions is made "
             "(default: its save_path, else the current directory)"),
    Variable("ORTMODULE_ENABLE_CUSTOM_AUTOGRAD", "enable_custom_autograd", "bool", True, parse.boolean,
             "run torch.autograd.Function calls as PythonOp nodes (0: let the exporter inline them)"),
    Variable("ORTMODULE_DISABLE_CUSTOM_AUTOGRAD_SUPPORT", "disable_custom_autograd", "bool", False, parse.boolean,
             "older inverse of ORTMODULE_ENABLE_CUSTOM_AUTOGRAD (1 inlines Functions)"),
    Variable("ORTMODULE_ALLOW_AUTOGRAD_CHECKPOINT", "allow_checkpoint", "bool", False, parse.boolean,
             "allow torch.utils.checkpoint regions (else a clear error)"),
    Variable("ORTMODULE_SKIPPED_AUTOGRAD_FUNCTIONS", "skipped_functions", "comma list", frozenset(), parse.names,
             "fully qualified torch.autograd.Function classes the exporter inlines instead"),
    Variable("ORTMODULE_MEMORY_OPT_LEVEL", "memory_opt_level", "0|1|2", 0, parse.memory_level,
             "recompute in backward instead of saving: 0 only ORTMODULE_MEMORY_OPT_CONFIG's plans; "
             "1 every recompute plan inside a detected transformer layer; 2 also the compromise plans"),
    Variable("ORTMODULE_MEMORY_OPT_CONFIG", "memory_opt_config", "plans or JSON path", (), parse.plans,
             "recompute plans '<cluster>:<strategy 0/1/2>:<count, -1 = all>', comma-separated, or a "
             "JSON file of such strings; cluster ids are listed by the memory report (INFO)"),
    Variable("ORTMODULE_MEMORY_BUDGET", "memory_budget", "bytes (KiB/MiB/GiB)", None, parse.byte_size,
             "the memory a training step may take beyond the parameters and optimizer state (what "
             "the memory report predicts: activations, saved values, outputs, gradients, and the "
             "fused LM head's chunks); before the first step the planner takes the cheapest plan "
             "whose predicted peak fits (128 and 64 MiB LM-head chunks, then recompute levels 1 "
             "and 2, then smaller chunks) and logs it at INFO and in stats()['memory_plan']; when none fits, a MemoryBudgetError names the smallest budget that "
             "would (ours, not ORT's)"),
    Variable("ORTMODULE_PRINT_MEMORY_STATS", "print_memory_stats", "bool", False, parse.boolean,
             "log measured memory (RSS, CUDA, the engine's activation bytes) before and after "
             "forward and backward"),
    Variable("ORTMODULE_CACHE_DIR", "cache_dir", "path", None, parse.path,
             "cache exported graphs on disk: a later process with the same model and schema skips export"),
    Variable("ORTMODULE_DEEPCOPY_BEFORE_MODEL_EXPORT", "deepcopy_before_export", "bool", True, parse.boolean,
             "trace a structural copy of the module (parameters and buffers shared, not copied)"),
    Variable("ORTMODULE_SKIPCHECK_POLICY", "skipcheck", "flags", DEFAULT_SKIPCHECK, parse.skipcheck,
             "SKIP_CHECK_DISABLED: check parameter devices on every call and re-export on every "
             "attribute assignment (default: devices checked at export; unread attributes ignored)"),
    Variable("ORTMODULE_ENABLE_COMPUTE_OPTIMIZER", "compute_optimizer", "bool", True, parse.boolean,
             "compute-saving graph rewrites: 0 turns them all off (today: label sparsity)"),
    Variable("ORTMODULE_ENABLE_SPARSE_OPTIMIZER", "sparse_optimizer", "auto|0|1", "auto", parse.auto_bool,
             "label sparsity (the label_sparsity pass): a loss with an ignore_index over an LM head "
             "runs the head, the loss and their gradients on the rows whose label counts; auto: on "
             "CPU only (on CUDA the row count is a host wait each step, and a CUDA-graph capture "
             "cannot hold it); 1 also on CUDA without CUDA graphs"),
    Variable("ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER", "embedding_sparse_optimizer", "bool", False,
             parse.boolean,
             "padding elimination (the padding_elimination pass): the token-wise work of a "
             "transformer (embedding, norms, projections, MLP) runs on the positions whose "
             "attention_mask is not 0 or whose label counts; exact (the attention mask is checked "
             "each step, an error if it lets a counted position see a dropped one); fires only "
             "where no returned output reads the padding (ORTMODULE_SKIP_LOGITS=1 for a causal LM); "
             "two host reads per step; never under CUDA graphs"),
    Variable("ORTMODULE_EXPORT_DECISIONS_FROM_VALUES", "decisions_from_values", "bool", True, parse.boolean,
             "a module that branches on a tensor's value (a Python `if` torch.export cannot guard on) "
             "is exported with the decision taken from the call's values and checked in the graph on "
             "every later call; a call that flips it runs on a graph for its own outcome (exported "
             "once per outcome). 0: such a module does not export (fallback policy; ours, not ORT's)"),
    Variable("ORTMODULE_SKIP_LOGITS", "skip_logits", "bool", False, parse.boolean,
             "in training, a model that returns its `logits` beside its `loss` (a ModelOutput or "
             "dict, as Hugging Face causal LMs do) returns logits=None instead: the full B·T·vocab "
             "product is never computed, only the loss's chunks of it (ours, not ORT's; Liger's "
             "skip_logits)"),
    Variable("ORTMODULE_USE_EFFICIENT_ATTENTION", "efficient_attention", "bool", True, parse.boolean,
             "fuse attention subgraphs into PyTorch's fused attention kernels (the attention_fusion "
             "pass; on by default here, unlike ORT, since it is exact up to rounding; 0 turns it off)"),
    Variable("ORTMODULE_DISABLED_PASSES", "disabled_passes", "comma list", frozenset(), parse.pass_names,
             "graph passes to skip, by name (torch_ort.pass_names(); ours, not ORT's): to compare "
             "speed or to work around a pass"),
    Variable("ORTMODULE_ATEN_FALLBACK", "aten_fallback", "bool", True, parse.boolean,
             "run ops the engine lacks through the ATen dispatcher inside the graph (ours, not ORT's)"),
    Variable("ORTMODULE_GRADIENT_RELEASE", "gradient_release_mb", "MiB", 1.0, parse.mebibytes,
             "hand parameter gradients to PyTorch (param.grad, DDP's all-reduce hooks) during "
             "backward, a group of at least this many MiB as soon as it is final; 0: all at the "
             "end of backward (ours, not ORT's)"),
    Variable("ORTMODULE_USE_CUDA_GRAPH", "use_cuda_graph", "bool", False, parse.boolean,
             "on CUDA, capture a steady-state step's forward and backward once per input shape "
             "and replay them as CUDA graphs (host time per step: a few launches); needs a graph "
             "without device->host reads or PythonOp/ATenOp nodes, else runs uncaptured with a "
             "warning; inputs are copied in; outputs and `.grad` are the graphs' buffers, an "
             "output read after the next replay raises ([performance.md](performance.md), "
             "\"CUDA graphs\") (ours, not ORT's)"),
    Variable("ORTMODULE_PROGRESS", "progress", "bool", True, parse.boolean,
             "when a call exports and builds for more than 3 s (a first step), say on stderr which "
             "stage it is in and, at the end, what each took (0: silent; ranks other than 0 always "
             "are) (ours, not ORT's)"),
    Variable("ORTMODULE_CPU_BUFFER_POOL", "cpu_buffer_pool", "bool", True, parse.boolean,
             "keep the engine's large CPU buffers (1 MiB and up: the fused LM head's chunk of "
             "logits and its weight's gradient, an embedding's gradient) for the next step "
             "instead of mapping fresh pages each "
             "step; a buffer unused for a whole step is given back; process-wide, the last "
             "engine built sets it; stats()['cpu_buffer_pool'] (ours, not ORT's)"),
    Variable("ORTMODULE_MAX_CACHED_GRAPHS", "max_cached_graphs", "int", 16, parse.count,
             "exported graphs (with their engines) one ORTModule keeps, one per input schema; "
             "beyond it the least recently used is dropped and re-exported if seen again; "
             "0: no bound (ours, not ORT's)"),
)


@dataclass(frozen=True)
class OrtOnly:
    name: str    # ONNX Runtime's environment variable
    reason: str  # why torch_ort does not read it (docs/migration.md has the entry)


# Every other ORTMODULE_* variable ONNX Runtime 1.19 reads (its options.py, __init__.py, the
# PythonOp exporter, the Triton and graph-optimizer packages), with why it is not read here.
ORT_ONLY: tuple[OrtOnly, ...] = (
    OrtOnly("ORTMODULE_PRINT_INPUT_DENSITY",
            "ORT logs, every step, the share of label inputs not equal to the loss's ignore_index and "
            "of embedding ids not equal to padding_idx, to steer its sparsity rewrites; there are no "
            "such rewrites here, and a count every step would make each step wait on the device"),
    OrtOnly("ORTMODULE_CONV_ALGO_SEARCH",
            "it picks ORT's own cuDNN convolution algorithm search; convolutions here run through "
            "ATen, whose search torch.backends.cudnn.benchmark controls"),
    OrtOnly("ORTMODULE_MEMORY_OPT_PROBE_RECOMPUTE_LEVEL",
            "it sets how deep ORT's memory optimizer probes for recompute subgraphs; ours probes one "
            "fixed depth and ORTMODULE_MEMORY_OPT_LEVEL chooses which plans run"),
    OrtOnly("ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT",
            "it hands each gradient to PyTorch as soon as it is computed; here "
            "ORTMODULE_GRADIENT_RELEASE does that and is on by default (0 turns it off)"),
    OrtOnly("ORTMODULE_ENABLE_ZERO_STAGE3",
            "it lets ORT's graph gather DeepSpeed ZeRO stage-3 partitioned parameters itself; "
            "torch_ort has no such mode (ZeRO stages 1 and 2 work as with any module)"),
    OrtOnly("ORTMODULE_USE_TRITON",
            "ORT generates Triton kernels for some subgraphs; the engine here runs its own CPU/CUDA "
            "kernels and ATen, and has no Triton code generator"),
    OrtOnly("ORTMODULE_TRITON_CONFIG_FILE", "it configures ORT's Triton code generator, which is not here"),
    OrtOnly("ORTMODULE_TRITON_DEBUG", "it dumps ORT's generated Triton code, which is not here"),
    OrtOnly("ORTMODULE_ENABLE_TUNING",
            "it tunes ORT's Triton and execution-provider kernels online; there is no kernel tuner here"),
    OrtOnly("ORTMODULE_MAX_TUNING_DURATION_MS", "it bounds ORT's online kernel tuning, which is not here"),
    OrtOnly("ORTMODULE_TUNING_RESULTS_PATH", "it stores ORT's kernel tuning results, which are not here"),
    OrtOnly("ORTMODULE_USE_FLASH_ATTENTION",
            "it fuses attention into ORT's Triton flash-attention kernel; here "
            "ORTMODULE_USE_EFFICIENT_ATTENTION fuses attention into PyTorch's fused attention, "
            "which picks a flash kernel itself where the device has one"),
    OrtOnly("ORTMODULE_ATEN_SDPA_FALLBACK",
            "it exports scaled_dot_product_attention as an ATen op; here attention goes through "
            "ORTMODULE_USE_EFFICIENT_ATTENTION's fusion, and ops the engine lacks run through ATen "
            "anyway (ORTMODULE_ATEN_FALLBACK)"),
    OrtOnly("ORTMODULE_ENABLE_DATA_OBSERVER",
            "older ORT's name for the input-density log (ORTMODULE_PRINT_INPUT_DENSITY), not read here"),
    OrtOnly("ORTMODULE_JSON_CONFIG_PATH",
            "it names a JSON file for ORT's experimental load_from_json; there is no such loader "
            "here: set the variables themselves"),
)

_told: set = set()  # ORT-only and unknown variables already reported in this process


def _tell_unread(environ) -> None:
    """Once per name: an ORT_ONLY variable says it has no effect and why; an ORTMODULE_* name in
    neither table names the closest valid one."""
    ours = {v.name for v in VARIABLES}
    ort_only = {v.name: v.reason for v in ORT_ONLY}
    for name in sorted(environ):
        if not name.startswith("ORTMODULE_") or name in ours or name in _told:
            continue
        if name in ort_only:
            if environ[name].strip():
                _told.add(name)
                warnings.warn(f"{name} is ONNX Runtime's and has no effect in torch_ort: "
                              f"{ort_only[name]} (docs/migration.md)", ConfigurationWarning, stacklevel=2)
            continue
        _told.add(name)
        # compared without the shared prefix, which would make every name look close
        prefix = len("ORTMODULE_")
        close = difflib.get_close_matches(name[prefix:], [n[prefix:] for n in (*ours, *ort_only)],
                                          n=1, cutoff=0.6)
        hint = (f"did you mean ORTMODULE_{close[0]}?" if close
                else "the variables are listed in docs/configuration.md")
        warnings.warn(f"{name} is not a torch_ort or ONNX Runtime variable and is ignored; {hint}",
                      ConfigurationWarning, stacklevel=2)


@dataclass(frozen=True)
class Settings:
    """The parsed value of every variable (attribute names: Variable.field)."""

    values: dict

    def __getattr__(self, field: str):
        try:
            return self.__dict__["values"][field]
        except KeyError:
            raise AttributeError(field) from None

    @classmethod
    def from_env(cls, environ=None) -> "Settings":
        environ = os.environ if environ is None else environ
        _tell_unread(environ)
        values = {}
        for var in VARIABLES:
            text = environ.get(var.name, "")
            values[var.field] = var.parse(var.name, text) if text.strip() else var.default
        return cls(values)

    @property
    def custom_autograd(self) -> bool:
        """Functions run as PythonOp unless either variable switches that off."""
        return self.enable_custom_autograd and not self.disable_custom_autograd

    def set_explicitly(self, environ=None) -> list[str]:
        environ = os.environ if environ is None else environ
        return [v.name for v in VARIABLES if environ.get(v.name, "").strip()]


def documentation() -> str:
    """The markdown table of every variable (the README's list is generated from this)."""
    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for v in VARIABLES:
        if v.default in (None, (), frozenset()):
            default = "unset"
        elif isinstance(v.default, bool):
            default = str(int(v.default))
        else:
            default = getattr(v.default, "name", None) or str(v.default)
        cells = (f"`{v.name}`", v.type, default, v.help)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)
