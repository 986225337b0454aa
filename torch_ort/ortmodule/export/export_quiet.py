"""What an export prints, kept out of the user's output: torch.onnx, torch.export, dynamo and
onnxscript log and warn a lot while a model exports, and torch.export prints partial graphs of a
failed capture to stderr. quiet_exporter() quiets them for the export's duration only, and never
where the user asked to see them."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import threading
import warnings

from torch_ort.ortmodule.policy.debug_options import LOGGER


class _ThreadStderr:
    """sys.stderr while an export runs: the exporting thread's writes go to `captured`, every
    other thread's to the real stderr (another thread training meanwhile keeps its output)."""

    def __init__(self, real, captured: io.StringIO):
        self._real, self._captured, self._thread = real, captured, threading.get_ident()

    def write(self, text):
        target = self._captured if threading.get_ident() == self._thread else self._real
        return target.write(text)

    def __getattr__(self, name):  # flush, fileno, isatty, encoding, ...: the real stream's
        return getattr(self._real, name)


# The libraries whose warnings an export silences (the model's own code keeps its warnings), and
# this module, where torch.onnx's warnings about the export call itself point.
_EXPORTER_MODULES = r"(torch|onnxscript|onnx_ir|onnx)(\.|$)|torch_ort\.ortmodule\.export\.exporter$"


@contextlib.contextmanager
def quiet_exporter():
    """The exporter logs and warns a lot at INFO/WARNING; keep user output readable, within the
    export only: its loggers are set to ERROR and the warnings issued from torch, onnx and
    onnxscript code are ignored, both restored when the export ends. Nothing is quieted when the
    user asked to see it: TORCH_LOGS set, a level set on one of those loggers, or torch_ort's own
    log at VERBOSE. The logger levels and warning filters are process-wide: while an export runs
    (serialised by EXPORT_LOCK), another thread's warnings from those libraries are not shown."""
    if os.environ.get("TORCH_LOGS") or LOGGER.getEffectiveLevel() <= logging.DEBUG:
        yield
        return
    loggers = [lg for lg in (logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo",
                                                               "torch.fx.experimental.symbolic_shapes",
                                                               "onnxscript"))
               if lg.level == logging.NOTSET]  # a level someone set is theirs
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    stderr = io.StringIO()  # torch.export prints partial graphs of a failed capture to stderr
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(_ThreadStderr(sys.stderr, stderr)):
            warnings.filterwarnings("ignore", module=_EXPORTER_MODULES)
            yield
    finally:
        for lg in loggers:
            lg.setLevel(logging.NOTSET)
        if stderr.getvalue().strip():
            LOGGER.debug("exporter output:\n%s", stderr.getvalue())
