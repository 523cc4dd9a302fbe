"""Engines that run a model: the one training loop, batched inference, prediction sources
(torch models; ONNX ones are in `export/source.py`), FLOP counting, and the inputs a model
takes by modality (`modality.py`).
Below `methods/` (methods train and run models through them), above `models/`."""
