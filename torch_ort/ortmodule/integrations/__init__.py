"""Other libraries ORTModule meets inside a call: transformers (hf: its calls, caches and outputs)."""
