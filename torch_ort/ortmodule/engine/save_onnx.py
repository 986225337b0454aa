"""DebugOptions(save_onnx=True): the graphs of an engine's stages, written as ONNX Runtime names them."""
from __future__ import annotations

import os

from torch_ort.ortmodule.export.exporter import ExportResult, exported_with_weights
from torch_ort.ortmodule.policy.debug_options import LOGGER, DebugOptions


def save_onnx_stages(debug: DebugOptions, export: ExportResult, engine, training: bool) -> None:
    """DebugOptions(save_onnx=True): each stage under ONNX Runtime's file name for that stage,
    `{prefix}_{stage}_{mode}.onnx`, mode `training` for an engine with gradients (ORT's training
    manager) and `inference` for a forward-only one, so neither overwrites the other. Training
    engines write torch_exported (the exporter's graph), optimized_pre_grad (the forward after
    our passes, before autodiff) and execution_model (forward+backward as the engine runs it:
    recompute and host placement applied); inference engines write torch_exported and
    execution_model (the forward that runs). ORT's post_processed and optimized stages have no
    graph of their own here (docs/migration.md)."""
    directory = debug.save_dir
    base = os.path.join(directory, debug.onnx_prefix)
    os.makedirs(directory, exist_ok=True)
    exported = (exported_with_weights(export) if export.raw_model is not None
                else export.onnx_bytes)  # from the cache: weights stay graph inputs
    stages = {"torch_exported": lambda: exported}
    if training:
        stages["optimized_pre_grad"] = engine.forward_graph_onnx
        stages["execution_model"] = engine.training_graph_onnx
    else:
        stages["execution_model"] = engine.forward_graph_onnx
    mode = "training" if training else "inference"
    for stage, graph in stages.items():
        path = f"{base}_{stage}_{mode}.onnx"
        with open(path, "wb") as f:
            f.write(graph())
        LOGGER.info("saved %s", path)
