"""Data-dependent decisions: a Python `if` on a tensor's value (`if labels.max() >= vocab:`,
`if idx.size(0) > 0:` after a nonzero) that torch.export cannot guard on.

Such a module is exported again with the decision taken from the values of the call at hand
(torch's real-tensor propagation evaluates the condition on them and records it as a runtime
assertion), and each decision becomes a check in the graph: `DecisionCheck(output, cond)`
passes the first output through once the host has read that the condition still holds. A later
call whose values flip a decision raises `_C.DecisionChangedError` from the engine before any
output is returned; ORTModule then exports again with that call's values (the other branch) and
runs the call on the new graph. So a decision is never applied to values it does not hold for.

Only the assertions about data-dependent (unbacked) symbols become checks; the exporter's
assertions about input sizes are dropped as torch.onnx drops them.
"""
from __future__ import annotations

import contextlib
import re

import torch

_UNBACKED = re.compile(r"\bu\d+\b")  # torch's names for data-dependent symbols: u0, u1, ...


@torch.library.custom_op("torch_ort::decision_check", mutates_args=())
def decision_check(x: torch.Tensor, cond: torch.Tensor, message: str) -> torch.Tensor:
    """x, when cond holds (a decision the export took); the engine runs our DecisionCheck op."""
    if not bool(cond):
        raise RuntimeError(f"a decision the export took does not hold: {message}")
    return x.clone()


@decision_check.register_fake
def _(x, cond, message):
    return torch.empty_like(x)


def _checks_instead_of_assertions(original):
    """torch.onnx's remove_assertion_nodes, except that each assertion about a data-dependent
    symbol becomes a DecisionCheck on the graph's first tensor output."""
    aten = torch.ops.aten

    def run(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
        graph = graph_module.graph
        output = next(n for n in graph.nodes if n.op == "output")
        flat = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
        at = next((i for i, n in enumerate(flat) if isinstance(n, torch.fx.Node) and
                   isinstance(n.meta.get("val"), torch.Tensor)), None)
        seen = set()
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not aten._assert_scalar.default:
                continue
            message = (str(node.args[1]) if len(node.args) > 1 else "").split(" on node ")[0]
            if at is None or not _UNBACKED.search(message) or message in seen:
                continue
            seen.add(message)
            target = flat[at]
            fake = target.meta["val"]
            with graph.inserting_before(output):
                cond = graph.call_function(aten.scalar_tensor.default, (node.args[0],), {"dtype": torch.bool})
                checked = graph.call_function(torch.ops.torch_ort.decision_check.default,
                                              (target, cond, message.removeprefix("Runtime assertion failed for ")))
            with fake.fake_mode:
                cond.meta["val"] = torch.empty((), dtype=torch.bool)
                checked.meta["val"] = torch.empty_like(fake)
            flat[at] = checked
            # The exporter names the graph's outputs after the nodes the export's signature names:
            # the check takes the output's name, the value it checks another.
            name = target.name
            target.name = graph._graph_namespace.create_name(f"{name}_unchecked", None)
            checked.name = name
        if at is not None:
            output.args = (type(output.args[0])(flat) if isinstance(output.args[0], (list, tuple)) else flat[0],)
        graph_module.recompile()
        return original(graph_module)

    return run


@contextlib.contextmanager
def taken_from_values():
    """Export with data-dependent decisions taken from the call's values, each checked at run time."""
    import torch._functorch.config as functorch_config
    from torch.onnx._internal.exporter import _fx_passes

    original = _fx_passes.remove_assertion_nodes
    _fx_passes.remove_assertion_nodes = _checks_instead_of_assertions(original)
    program = torch.export.ExportedProgram
    decompose = program.run_decompositions

    def run_decompositions(self, *args, **kwargs):
        # The captured graph holds every decision already: what follows the capture (the
        # decompositions' retrace, the exporter's passes that re-run the graph) has no Python
        # branch left to take, and cross-checking it against real values fails where the capture
        # renamed a data-dependent size ("mismatch between fake value u53 and real value 32") or
        # asserts on stale ones. Those steps reuse the capture's fake mode: it stops propagating
        # real values for the rest of this export (the mode is this export's own).
        def stop_propagating(ep):
            mode = torch._guards.detect_fake_mode(
                [n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"])
            if getattr(mode, "propagate_real_tensors", False):
                mode.propagate_real_tensors = False

        stop_propagating(self)
        with functorch_config.patch(fake_tensor_propagate_real_tensors=False):
            result = decompose(self, *args, **kwargs)
        stop_propagating(result)
        return result

    program.run_decompositions = run_decompositions
    try:
        with functorch_config.patch(fake_tensor_propagate_real_tensors=True), _signbit_is_bool(), \
                _unbacked_offsets_unchecked(), _in_place_ops_applied_once():
            yield
    finally:
        _fx_passes.remove_assertion_nodes = original
        program.run_decompositions = decompose


@contextlib.contextmanager
def _signbit_is_bool():
    """prims.signbit's meta kernel gives an integer input's dtype where the real kernel gives bool;
    with real values propagated, torch checks the two against each other and the export fails
    ("MetadataMismatchError: Dtypes torch.bool and torch.int64") wherever an integer floor
    division is traced (Wav2Vec2's output lengths). Within the block its meta result is bool."""
    op = torch.ops.prims.signbit.default
    meta = getattr(op, "prim_meta_impl", None)
    if meta is None:
        yield
        return
    op.prim_meta_impl = lambda a: torch.empty_like(a, dtype=torch.bool)
    try:
        yield
    finally:
        op.prim_meta_impl = meta


@contextlib.contextmanager
def _unbacked_offsets_unchecked():
    """Real-tensor propagation compares each op's real output with its fake one, the storage offset
    included, before the real values of the op's new data-dependent symbols are known: a view at
    a data-dependent index (`for i in idx.nonzero(): w[i]`, the eager experts loop of transformers'
    mixture-of-experts layers) has an offset such as u3, and the comparison itself becomes a guard
    torch.export cannot take ("Could not guard on data-dependent expression Ne(u3, 0)"). Within the
    block such an offset is not compared; everything else is, as torch does."""
    from torch._subclasses import fake_utils
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    compare = fake_utils._check_fake_real_tensors

    def check(real_out, fake_out, context="", sizes=True, strides=False, storage_offset=True,
              requires_grad=True):
        offset = fake_out.storage_offset()
        if not (isinstance(offset, torch.SymInt) and free_unbacked_symbols(offset)):
            return compare(real_out, fake_out, context, sizes, strides, storage_offset, requires_grad)
        if requires_grad and real_out.requires_grad != fake_out.requires_grad:
            raise fake_utils.MetadataMismatchError(f"{context} mismatched requires_grad-ness of outputs")
        torch._prims.utils.compare_tensor_meta(real_out, fake_out, check_sizes=sizes, check_strides=strides,
                                               allow_rhs_unbacked=True)

    fake_utils._check_fake_real_tensors = check
    try:
        yield
    finally:
        fake_utils._check_fake_real_tensors = compare


@contextlib.contextmanager
def _in_place_ops_applied_once():
    """With real values propagated, the fake mode runs an in-place op's real kernel on the real
    tensors (mutating them), then, for an op it computes through a decomposition (`index_add_`
    with symbolic sizes: `index_add` then `copy_`), dispatches the decomposition's ops, whose real
    kernels apply the op a second time. The values every later decision is taken from are then
    wrong (the eager experts loop accumulates each expert's output twice, and routes the next
    layer's tokens differently from eager). Within the block each mutated real tensor is set, after
    the op, to the op applied once to what it held before."""
    from torch._library.utils import is_builtin, zip_schema
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.utils import _pytree as pytree
    from torch.utils._mode_utils import no_dispatch

    dispatch = FakeTensorMode._dispatch_impl

    def real(mode, value):
        if isinstance(value, FakeTensor):
            return value.real_tensor
        if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
            expr = value.node.expr.xreplace(mode.shape_env.backed_var_to_val).xreplace(
                mode.shape_env.real_tensor_prop_unbacked_vals)
            return value.node.pytype(expr) if not expr.free_symbols else None
        return value

    def dispatch_once(self, func, types, args, kwargs):
        schema = getattr(func, "_schema", None)
        if not (self.propagate_real_tensors and schema is not None and schema.is_mutable and
                is_builtin(func) and torch.Tag.nondeterministic_seeded not in func.tags):
            return dispatch(self, func, types, args, kwargs)
        bound = list(zip_schema(schema, args, kwargs))
        written = [v for info, v in bound if info.alias_info is not None and info.alias_info.is_write
                   and isinstance(v, FakeTensor) and v.real_tensor is not None]
        with no_dispatch():
            before = [v.real_tensor.clone() for v in written]
        out = dispatch(self, func, types, args, kwargs)
        values = {id(v): b for v, b in zip(written, before)}
        missing = []

        def to_real(v):
            r = values[id(v)] if id(v) in values else real(self, v)
            if r is None:
                missing.append(v)
            return r

        real_args, real_kwargs = pytree.tree_map(to_real, (args, kwargs))
        if missing:
            return out  # a value not known yet: nothing to replay
        with no_dispatch():
            func(*real_args, **real_kwargs)
            for v, once in zip(written, before):
                if v.real_tensor is not None and v.real_tensor.shape == once.shape:
                    v.real_tensor.copy_(once)
        return out

    FakeTensorMode._dispatch_impl = dispatch_once
    try:
        yield
    finally:
        FakeTensorMode._dispatch_impl = dispatch


def count(onnx_model) -> int:
    """How many DecisionChecks an exported graph holds."""
    return sum(1 for n in onnx_model.graph if n.op_type == "DecisionCheck")
