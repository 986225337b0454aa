"""The module to ONNX: torch.onnx's export with our translations, shape plans, autocast rules and
workarounds; PythonOp and ATen-fallback routing; the export cache on disk; inference export."""
