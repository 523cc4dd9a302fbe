"""Deployment: ONNX export with a parity gate, safetensors export, a torch-free predictor."""
