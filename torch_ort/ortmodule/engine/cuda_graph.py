"""CUDA graphs (ORTMODULE_USE_CUDA_GRAPH=1): a steady-state training step's forward and backward,
captured once per input signature and replayed, so a step costs a few launches of host time.

GraphedEngine stands where the engine stands (the bridge calls forward, backward_begin and
backward_take; everything else is the engine's). Per input signature (sizes, strides, dtypes):

1. The first WARMUP calls run uncaptured. They show what a capture needs: no device→host read in
   either half (Engine.last_host_reads_*: the host could not run ahead of a graph), no code we do
   not control (PythonOp, ATenOp: Engine.runs_opaque_code), and which outputs receive a gradient
   (the same in each warm-up backward).
2. The next call captures both halves into one memory pool, after one uncaptured run on the
   capture stream (lazy initialisation must not happen inside a capture) with the random state
   put back, so the step draws what an uncaptured one would. Static buffers: the user's inputs
   (copied in at every replay), the parameters (the live tensors: an optimizer that updates them
   in place keeps their addresses), the output gradients (copied in), and the outputs and input
   gradients the graphs write.
3. Later calls copy the inputs in and replay. Nothing the graphs wrote is copied out (module
   "Replay buffers" below): the outputs and the parameters' gradients are the graphs' own buffers.
   Dropout draws through PyTorch's graph-safe generator: each replay gets fresh offsets.

Replay buffers: what a replay writes, and when it may (replay_buffers.py).

Never a wrong result: a parameter that moved (module.to(), a replaced Parameter) drops the
capture; a second forward while a replayed one awaits its backward (gradient accumulation over
several forwards) runs uncaptured; a new signature warms up and captures its own graphs (at most
MAX_GRAPHS per engine, then uncaptured); a backward that brings a gradient for an output the
captured one did not is refused with a clear error (the captured backward computes only what that
pattern needs), and one that brings fewer gets zeros for the missing ones. Capture failures disable
the signature with a warning and run uncaptured.

The capture mechanism is a small backend (CudaGraphBackend) so that the logic above is tested on
the CPU with a stand-in whose replay re-runs the captured calls into the same tensors."""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from torch_ort.ortmodule.engine.replay_buffers import grads_free, invalidate, outputs_free, storage_refs, tracks_buffers
from torch_ort.ortmodule.policy.debug_options import LOGGER

WARMUP = 2       # uncaptured calls of a signature before it is captured
MAX_GRAPHS = 4   # captured signatures per engine (each holds its activations' memory)

def signature(inputs) -> tuple:
    """Sizes, strides, dtypes and devices of the caller's tensors. Parameters are not in it: they
    are checked by address at every call (_params_moved), and a parameter that changed shape, dtype
    or device has a new address, so the per-call work stays one pass over the parameters."""
    return tuple((tuple(t.shape), tuple(t.stride()), t.dtype, t.device) for t in inputs)


class CudaGraphBackend:
    """torch.cuda.CUDAGraph: capture on a side stream into a shared private pool."""

    def __init__(self):
        self.stream = None

    def applies(self, inputs) -> bool:
        return bool(inputs) and inputs[0].is_cuda

    def new_pool(self):
        return torch.cuda.graph_pool_handle()

    def rng_state(self):
        return torch.cuda.get_rng_state()

    def set_rng_state(self, state) -> None:
        torch.cuda.set_rng_state(state)

    def warm_up(self, fn) -> None:
        """Runs fn once on the capture stream (cuBLAS workspaces, caches, lazy allocations)."""
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            fn()
        torch.cuda.current_stream().wait_stream(self.stream)

    def capture(self, fn, pool):
        """(graph, what fn returned): fn's kernels recorded, not run."""
        from torch_ort import _C

        graph = torch.cuda.CUDAGraph()
        with _C.CudaGraphCapture(), torch.cuda.graph(graph, pool=pool, stream=self.stream):
            result = fn()
        return graph, result


@dataclass
class _Captured:
    """One signature's graphs and static buffers."""

    inputs: list                 # user-input buffers (copied into) then the parameters
    param_ptrs: tuple            # data_ptr of each parameter at capture
    pattern: tuple               # per output: receives a gradient
    outputs: list                # what the forward graph writes
    grads_in: list               # per output: the buffer its gradient is copied into, or None
    grads_out: list              # per graph input: what the backward graph writes (or None)
    forward: object = None       # graphs (backend objects)
    backward: object = None
    pool: object = None
    in_flight: object = None     # weakref to the _GraphRun awaiting its backward
    output_refs: list = field(default_factory=list)  # storage_refs of each output with none handed out
    grad_refs: list = field(default_factory=list)    # the same for grads_out (0 where None)
    handed: list = field(default_factory=list)       # weakrefs to the outputs the last replay returned
    warned: bool = False         # said once that a kept output alias made a call run uncaptured
    warned_grads: bool = False   # the same for a kept gradient


@dataclass
class _Plain:
    """An uncaptured forward's context, with the signature its backward is recorded under."""

    ctx: object
    key: tuple


@dataclass
class _GraphRun:
    """A replayed forward's context: its backward replays the backward graph."""

    captured: _Captured
    params: list = field(default_factory=list)  # this call's parameters (whose .grad may alias)
    consumed: bool = False


@dataclass
class _GraphBackward:
    captured: _Captured
    params: list = field(default_factory=list)
    replayed: bool = False


@dataclass
class _Warmup:
    calls: int = 0
    patterns: list = field(default_factory=list)  # gradient patterns of finished warm-up backwards
    clean: bool = True           # no warm-up call read from the device
    failed: bool = False         # capture failed or is impossible: never again


class GraphedEngine:
    """An engine whose steady-state calls replay CUDA graphs (module doc). `num_user`: how many
    leading graph inputs are the caller's tensors (the rest are parameters and buffers)."""

    def __init__(self, engine, num_user: int, backend=None, warmup: int = WARMUP,
                 max_graphs: int = MAX_GRAPHS, zero_copy: bool | None = None):
        self._engine, self._num_user = engine, num_user
        self._zero_copy = tracks_buffers() if zero_copy is None else zero_copy
        self._backend = backend or CudaGraphBackend()
        self._warmup, self._max_graphs = warmup, max_graphs
        self._graphs: dict = {}      # signature -> _Captured
        self._seen: dict = {}        # signature -> _Warmup
        self.captures = 0
        self.replays = 0

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def cuda_graph_stats(self) -> dict:
        return {"captures": self.captures, "replays": self.replays}

    # --- the engine interface the bridge uses ----------------------------------------------------
    def forward(self, inputs):
        if not self._backend.applies(inputs):
            return self._engine.forward(inputs)
        key = signature(inputs[:self._num_user])
        captured = self._graphs.get(key)
        if captured is not None and not self._params_moved(captured, inputs):
            # Checks first, without side effects: a call that then runs uncaptured leaves the
            # earlier outputs valid (nothing overwrites them).
            if (self._idle(captured) and outputs_free(captured, self._zero_copy)
                    and grads_free(captured, inputs[self._num_user:], True, self._num_user, self._zero_copy)):
                return self._replay_forward(captured, inputs)
            # Another forward awaits its backward, or something still reads the graphs' buffers.
            outputs, ctx = self._engine.forward(inputs)
            return outputs, ctx
        seen = self._seen.setdefault(key, _Warmup())
        if self._ready(seen) and len(self._graphs) < self._max_graphs:
            captured = self._capture(key, inputs, seen)
            if captured is not None:
                return self._replay_forward(captured, inputs)
        outputs, ctx = self._engine.forward(inputs)
        seen.calls += 1
        seen.clean &= self._engine.last_host_reads_forward == 0
        return outputs, (_Plain(ctx, key) if ctx is not None else None)

    def backward_begin(self, run_ctx, grad_outputs):
        if isinstance(run_ctx, _GraphRun):
            return self._replay_backward_begin(run_ctx, grad_outputs)
        if isinstance(run_ctx, _Plain):
            seen = self._seen.get(run_ctx.key)
            if seen is not None:
                seen.patterns.append(self._pattern(grad_outputs))
            run = self._engine.backward_begin(run_ctx.ctx, grad_outputs)
            return _PlainBackward(run, seen, self._engine)
        return self._engine.backward_begin(run_ctx, grad_outputs)

    def backward_take(self, run, steps: int, inputs: list):
        if isinstance(run, _GraphBackward):
            captured = run.captured
            if not run.replayed:
                if self._zero_copy:
                    grads_free(captured, run.params, False, self._num_user, self._zero_copy)
                self._backend_replay(captured.backward)
                run.replayed = True
            if not self._zero_copy:
                return [captured.grads_out[i] for i in inputs]
            # A parameter's gradient as a new tensor on the buffer: autograd adopts it as .grad
            # (no copy) when .grad is None. The caller's tensors get the buffer (autograd copies).
            n = self._num_user
            return [g.detach() if g is not None and i >= n else g
                    for i, g in ((i, captured.grads_out[i]) for i in inputs)]
        if isinstance(run, _PlainBackward):
            grads = self._engine.backward_take(run.run, steps, inputs)
            run.finish_if_done()
            return grads
        return self._engine.backward_take(run, steps, inputs)

    # --- capture -------------------------------------------------------------------------------
    def _pattern(self, grad_outputs) -> tuple:
        diff = self._engine.output_differentiable
        return tuple(bool(d and g is not None) for g, d in zip(grad_outputs, diff))

    def _ready(self, seen: _Warmup) -> bool:
        if seen.failed or seen.calls < self._warmup or len(seen.patterns) < self._warmup:
            return False
        if not seen.clean:
            return self._give_up(seen, "a warm-up step read values back from the device "
                                       "(stats()['host_reads_forward'/'host_reads_backward'])")
        if self._engine.runs_opaque_code:
            return self._give_up(seen, "the graph runs PythonOp/ATenOp nodes (user or PyTorch code "
                                       "that may wait on the device)")
        if len(set(seen.patterns[-self._warmup:])) != 1:
            return False  # which outputs get a gradient is still changing: keep warming up
        return True

    def _give_up(self, seen: _Warmup, why: str) -> bool:
        seen.failed = True
        LOGGER.warning("ORTMODULE_USE_CUDA_GRAPH: this input signature runs without CUDA graphs: %s", why)
        return False

    def _params_moved(self, captured: _Captured, inputs) -> bool:
        n = self._num_user
        if all(t.data_ptr() == p for t, p in zip(inputs[n:], captured.param_ptrs)):
            return False
        LOGGER.info("ORTMODULE_USE_CUDA_GRAPH: parameters moved since the capture (module.to(), a "
                    "replaced Parameter, an optimizer that does not update in place); recapturing")
        key = signature(inputs[:n])
        del self._graphs[key]
        self._seen.pop(key, None)
        return True

    def _capture(self, key, inputs, seen: _Warmup):
        engine, backend, n = self._engine, self._backend, self._num_user
        pattern = seen.patterns[-1]
        static = [t.clone() for t in inputs[:n]] + list(inputs[n:])
        cell = {}  # the RunContext the forward made, for the backward (a replay stand-in re-runs both)

        def run_forward():
            outputs, ctx = engine.forward(static)
            cell["ctx"] = ctx
            return outputs

        def run_backward(grads_in):
            return engine.backward(cell["ctx"], grads_in)

        try:
            rng = backend.rng_state()
            # Warm-up on the capture stream: each half once, results dropped, random state restored.
            def warm():
                outputs = run_forward()
                if cell["ctx"] is not None:
                    run_backward([torch.zeros_like(o) if p else None for o, p in zip(outputs, pattern)])
            backend.warm_up(warm)
            backend.set_rng_state(rng)
            pool = backend.new_pool()
            fwd, outputs = backend.capture(run_forward, pool)
            grads_in = [torch.empty_like(o) if p else None for o, p in zip(outputs, pattern)]
            bwd, grads_out = (None, [])
            if cell["ctx"] is not None:
                # Its own pool: memory the forward graph used for temporaries and that a forward
                # replay writes again must never be where a .grad lives (module doc).
                bwd, grads_out = backend.capture(lambda: run_backward(grads_in), backend.new_pool())
            backend.set_rng_state(rng)  # the capture drew nothing the replay will not draw again
        except Exception as e:  # noqa: BLE001 - any capture failure: run this signature uncaptured
            self._give_up(seen, f"capture failed: {type(e).__name__}: {e}")
            return None
        captured = _Captured(inputs=static, param_ptrs=tuple(t.data_ptr() for t in inputs[n:]),
                             pattern=pattern, outputs=list(outputs), grads_in=grads_in,
                             grads_out=list(grads_out), forward=fwd, backward=bwd, pool=pool)
        if self._zero_copy:  # what holds the buffers now (our lists, the engine) is the baseline
            captured.output_refs = [storage_refs(o) for o in captured.outputs]
            captured.grad_refs = [0 if g is None else storage_refs(g) for g in captured.grads_out]
        self._graphs[key] = captured
        self.captures += 1
        LOGGER.info("ORTMODULE_USE_CUDA_GRAPH: captured the step for inputs %s",
                    [tuple(t.shape) for t in inputs[:n]])
        return captured

    # --- replay --------------------------------------------------------------------------------
    def _idle(self, captured: _Captured) -> bool:
        run = captured.in_flight() if captured.in_flight is not None else None
        return run is None or run.consumed

    def _backend_replay(self, graph) -> None:
        graph.replay()

    def _replay_forward(self, captured: _Captured, inputs):
        # Inputs first: one may be an output of the last replay passed back in (x = model(x)),
        # which is invalidated only once it has been read.
        for buffer, t in zip(captured.inputs[:self._num_user], inputs[:self._num_user]):
            if buffer is not t:
                buffer.copy_(t)
        for ref in captured.handed:
            t = ref()
            if t is not None:
                invalidate(t)
        captured.handed = []
        self._backend_replay(captured.forward)
        self.replays += 1
        if self._zero_copy:  # the buffers themselves, as new tensors the next replay invalidates
            outputs = [o.detach() for o in captured.outputs]
            captured.handed = [weakref.ref(o) for o in outputs]
        else:
            outputs = [o.clone() for o in captured.outputs]
        if captured.backward is None:
            return outputs, None
        run = _GraphRun(captured, params=list(inputs[self._num_user:]))
        captured.in_flight = weakref.ref(run)
        return outputs, run

    def _replay_backward_begin(self, run: _GraphRun, grad_outputs):
        if run.consumed:
            raise RuntimeError("torch_ort: backward through the same ORTModule output twice; "
                               "pass retain_graph=True to the first backward is not supported")
        captured = run.captured
        pattern = self._pattern(grad_outputs)
        if any(p and not c for p, c in zip(pattern, captured.pattern)):
            raise RuntimeError(
                "torch_ort (ORTMODULE_USE_CUDA_GRAPH=1): this backward brings gradients for outputs "
                f"{[i for i, p in enumerate(pattern) if p]}, the captured step for outputs "
                f"{[i for i, p in enumerate(captured.pattern) if p]} only; a captured step keeps what "
                "that backward needs. Call backward the same way every step, or set "
                "ORTMODULE_USE_CUDA_GRAPH=0")
        run.consumed = True
        for buffer, g in zip(captured.grads_in, grad_outputs):
            if buffer is not None:  # an output the capture differentiated: no gradient now is zeros
                buffer.zero_() if g is None else buffer.copy_(g)
        return _GraphBackward(captured, params=run.params)


class _PlainBackward:
    """An uncaptured backward: records, when it finishes, whether it read from the device."""

    def __init__(self, run, seen: _Warmup | None, engine):
        self.run, self._seen, self._engine = run, seen, engine

    def finish_if_done(self) -> None:
        if self._seen is not None and self.run.finished:
            self._seen.clean &= self._engine.last_host_reads_backward == 0
            self._seen = None
