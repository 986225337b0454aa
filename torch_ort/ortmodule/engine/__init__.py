"""Running an export: engines built from it (runner), the autograd bridge, CUDA graphs, the plan
cache per input schema, memory measurement and first-step progress."""
