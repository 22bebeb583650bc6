"""draftfit: choose a speculative-decoding draft for a vLLM deployment by measurement.

The pipeline, one module per step:
check (compat) -> prompts -> trajectories (engines/) -> acceptance -> cost (costmodel, hardware,
vram) -> rank -> report -> verify. Importing this package is light: no torch, no vLLM.
"""

__version__ = "0.1.0"
