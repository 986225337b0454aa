"""The version of torch_ort, its one source (setup.py and the release scripts read it here)."""
__version__ = "0.1.0"
