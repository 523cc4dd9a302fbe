"""`uqc serve`: an HTTP server (FastAPI + uvicorn, the `serve` extra) over the torch-free
ONNX Runtime Predictor, with concurrent requests micro-batched into one model call.

Nothing here imports torch or transformers: a deployment needs only numpy, onnxruntime,
tokenizers (text), pillow (images) and the `serve` extra. This package's `__init__` imports
nothing, so `uqc serve` can report a missing extra in one line (`deps.require_serve`).
"""
