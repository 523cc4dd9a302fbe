"""The GPU paths, checked in one short run on a lent GPU machine (`benchmarks/gpu_check.sh`).

Nothing here runs in CI or on the CPU machines; every number it prints is measured on the GPU
it runs on. Three checks, side by side in one process:

1. torch on CUDA in bfloat16 (`--dtype bfloat16`'s compute): the latency of one BERT-base-
   shaped classifier (12 layers, hidden 768, 12 heads; random weights, 2 labels), a Hydra of
   M=3 members pruned from it (each keeps 4 of the 12 heads of every layer, no head shared)
   and the deep ensemble of 3 (the dense model run 3 times), batch 32 x 128 tokens; ratios
   Hydra / single and Hydra / ensemble. Each model's float32 logits on the same inputs give
   the bfloat16 error (max |logits| difference).
2. ONNX Runtime's CUDA execution provider against its CPU provider on the exports of the
   single model and of the Hydra: max |probs| difference (the contract's `probs` output), and
   both providers' latency at batch 32.
3. The environment: GPU name, torch and CUDA versions, onnxruntime's providers.

    python benchmarks/gpu_check.py [--quick]

Refuses in one line, exit 2, where torch sees no CUDA device or onnxruntime has no
CUDAExecutionProvider: the check measures the GPU paths or nothing. `--simulate-on-cpu` runs
the same code with the CPU standing in for the GPU (its numbers mean nothing): how the script
itself is tested before it spends a lent GPU's minutes.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from hydra_cost import build_hydra, interleaved_medians

BATCH = 32
SEQUENCE = 128
MEMBERS = 3
DEVICE = "cuda"  # --simulate-on-cpu: "cpu"
PROVIDER = "CUDAExecutionProvider"  # --simulate-on-cpu: the CPU one


def refuse(message: str) -> None:
    print(f"gpu_check: {message}; nothing measured", file=sys.stderr)
    raise SystemExit(2)


def require_gpu() -> tuple[Any, Any]:
    """torch and onnxruntime, both able to use the GPU; else exit 2 with one line."""
    import onnxruntime as ort
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        refuse("torch sees no CUDA device (a CPU build?)")
    if PROVIDER not in ort.get_available_providers():
        refuse(
            "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu, the [gpu] extra)"
        )
    return torch, ort


def inputs(vocab: int, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Random token ids, every position real. Shape: each `[batch, SEQUENCE]` int64."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, size=(batch, SEQUENCE), dtype=np.int64)
    return {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "token_type_ids": np.zeros_like(ids),
    }


def timed_cuda(torch: Any, run: Any) -> Any:
    """`run`, then a CUDA synchronise: what a timed call must include on a GPU."""

    def call() -> None:
        run()
        if DEVICE == "cuda":
            torch.cuda.synchronize()

    return call


def torch_check(torch: Any, quick: bool) -> tuple[Any, Any]:
    """Check 1; returns (single, hydra) in float32 on the CPU for the export check."""
    from uqcompress.models.factory import create_model
    from uqcompress.models.outputs import member_logits

    preset = "tiny" if quick else "base"
    single = create_model("bert", ["neg", "pos"], preset, seed=0)
    feed = {k: torch.from_numpy(v) for k, v in inputs(single.config.vocab_size, 2, 1).items()}
    hydra, fusion_gap = build_hydra(single, MEMBERS, feed)
    batch = {
        k: torch.from_numpy(v).to(DEVICE)
        for k, v in inputs(single.config.vocab_size, BATCH, 2).items()
    }
    models = {"single": single.model, "hydra": hydra.model}
    errors = {}
    half = {}
    for name, model in models.items():
        gpu = copy.deepcopy(model).to(DEVICE).eval()
        with torch.inference_mode():
            reference = member_logits(gpu, batch).float()
            gpu.to(torch.bfloat16)
            errors[name] = float((member_logits(gpu, batch).float() - reference).abs().max())
        half[name] = gpu
    with torch.inference_mode():
        runners = [
            timed_cuda(torch, lambda: member_logits(half["single"], batch)),
            timed_cuda(torch, lambda: member_logits(half["hydra"], batch)),
            timed_cuda(
                torch, lambda: [member_logits(half["single"], batch) for _ in range(MEMBERS)]
            ),
        ]
        single_s, hydra_s, ensemble_s = interleaved_medians(runners, 3, 5 if quick else 30)
    print(f"\n## torch, CUDA, bfloat16, batch {BATCH} x {SEQUENCE} tokens ({preset} BERT)\n")
    print("| model | ms / batch | bf16 max abs logits error vs float32 |\n| --- | --- | --- |")
    print(f"| single | {single_s * 1e3:.2f} | {errors['single']:.2e} |")
    print(f"| Hydra M={MEMBERS} | {hydra_s * 1e3:.2f} | {errors['hydra']:.2e} |")
    print(f"| deep ensemble M={MEMBERS} | {ensemble_s * 1e3:.2f} | (as single) |")
    print(
        f"\nHydra / single {hydra_s / single_s:.2f}x, Hydra / deep ensemble "
        f"{hydra_s / ensemble_s:.2f}x; Hydra fused vs members (float32, CPU) {fusion_gap:.1e}"
    )
    return single, hydra


def ort_check(ort: Any, single: Any, hydra: Any, quick: bool) -> None:
    """Check 2: each export under the CUDA and the CPU provider."""
    from uqcompress.export.graph import graph_for
    from uqcompress.export.onnx import export_graph

    feed = inputs(single.config.vocab_size, BATCH, 3)
    print(f"\n## ONNX Runtime, CUDA vs CPU execution provider, batch {BATCH}\n")
    print("| export | max abs probs difference | CUDA ms | CPU ms |\n| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name, loaded in (("single", single), ("Hydra", hydra)):
            path = Path(tmp) / f"{name}.onnx"
            export_graph(graph_for(loaded.model, "text"), loaded, path, 18)
            names = {i.name for i in ort.InferenceSession(str(path)).get_inputs()}
            run_feed = {k: v for k, v in feed.items() if k in names}
            sessions = [
                ort.InferenceSession(str(path), providers=[provider])
                for provider in (PROVIDER, "CPUExecutionProvider")
            ]
            probs = [s.run(["probs"], run_feed)[0] for s in sessions]
            gap = float(np.abs(probs[0] - probs[1]).max())
            cuda_s, cpu_s = interleaved_medians(
                [lambda s=s, f=run_feed: s.run(None, f) for s in sessions], 2, 3 if quick else 10
            )
            print(f"| {name} | {gap:.2e} | {cuda_s * 1e3:.2f} | {cpu_s * 1e3:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny BERT, few repeats")
    parser.add_argument("--simulate-on-cpu", action="store_true", help="test this script")
    args = parser.parse_args()
    if args.simulate_on_cpu:
        global DEVICE, PROVIDER
        DEVICE, PROVIDER = "cpu", "CPUExecutionProvider"
    began = time.perf_counter()
    torch, ort = require_gpu()
    gpu = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "none (simulated on the CPU)"
    print(
        f"GPU: {gpu}; torch {torch.__version__} (CUDA {torch.version.cuda}); onnxruntime "
        f"{ort.__version__} {ort.get_available_providers()}"
    )
    single, hydra = torch_check(torch, args.quick)
    ort_check(ort, single, hydra, args.quick)
    print(f"\ngpu_check took {time.perf_counter() - began:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
