"""Engines that run a model: the one training loop, batched inference, prediction sources
(torch models; ONNX ones are in `export/source.py`) and FLOP counting.
Below `methods/` (methods train and run models through them), above `models/`."""
