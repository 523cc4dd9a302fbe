"""Engines that run a model: the one training loop, batched inference and FLOP counting.
Below `methods/` (methods train and run models through them), above `models/`."""
