"""How much memory does `uqc export` take, against the weights it exports? One run, on CPU.

Writes a random Qwen2.5-0.5B-shaped classifier (`qwen2`, `base` preset: 24 layers, hidden
896, MLP 4864; a 32,000-token vocabulary, so that the graph, about 1.4 GiB, is one `.onnx` file
without external data) as a float32 checkpoint, and, with `--half`, the same shape as a
bfloat16 checkpoint (the export traces it in float32). Then `uqc export` of each, in its own
process: wall seconds, the process's peak RSS, the float32 graph's weight bytes, and the
ratio of peak RSS to them, over two floors: the process's libraries (the peak of a process
that imports torch, transformers, onnxscript, ONNX Runtime and the export step, no model),
and the export of a narrow twin (the same 24 layers and vocabulary, 64 wide: the exporter's
own state for a graph of that depth, with 8 MB of weights), so the last column is what the
weights themselves cost.

    .venv/bin/python benchmarks/export_memory.py [--half] [--threads 2]

A plain `onnx.save` of the graph held two more copies of the weights (a ModelProto and its
bytes), and the parity check held torch's and ONNX Runtime's copies together: this measures
what is left (`docs/guide/large-models.md`, "Memory and time, measured").
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Run as a script, this file's folder is on sys.path: the sibling benchmark imports as a module.
from decoder_cost import measured

VOCAB = 32000


def libraries_rss() -> int:
    """Peak RSS of a process that only imports what `uqc export` runs on (torch,
    transformers, onnxscript, ONNX Runtime and the export step): the floor under any export."""
    probe = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)"
    )
    imports = "import torch, transformers, onnxscript, onnxruntime, uqcompress.steps.export"
    command = [sys.executable, "-c", probe, sys.executable, "-c", imports]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


NARROW = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
          "num_key_value_heads": 1}  # fmt: skip


def weight_bytes(onnx_dir: Path) -> int:
    """Bytes of the graph's weights: the external-data file, or the whole `.onnx` file."""
    data = onnx_dir / "model.onnx.data"
    return data.stat().st_size if data.exists() else (onnx_dir / "model.onnx").stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--half", action="store_true", help="also a bfloat16 checkpoint")
    parser.add_argument("--threads", type=int, default=2, choices=range(1, 65), metavar="1..64")
    args = parser.parse_args()
    gib = 1 << 30
    with tempfile.TemporaryDirectory(prefix="uqc-export-memory-") as tmp:
        root = Path(tmp)
        libraries = libraries_rss()
        rows = []
        init = ["init", "--family", "qwen2", "--preset", "base", "--labels", "neg,pos"]
        init += ["--set", f"vocab_size={VOCAB}"]
        narrow = [arg for key, value in NARROW.items() for arg in ("--set", f"{key}={value}")]
        measured([*init, *narrow, "--out", str(root / "narrow")], args.threads)
        twin = measured(
            ["export", str(root / "narrow"), "--out", str(root / "onnx-narrow")], args.threads
        )
        for dtype in ["float32", "bfloat16"] if args.half else ["float32"]:
            model, out = root / f"model-{dtype}", root / f"onnx-{dtype}"
            measured([*init, "--dtype", dtype, "--out", str(model)], args.threads)
            cost = measured(["export", str(model), "--out", str(out)], args.threads)
            rows.append((dtype, cost, weight_bytes(out)))
            for folder in (model, out):  # the next checkpoint needs the disk space
                shutil.rmtree(folder)
    floor = twin["peak_rss"]
    print(f"\nthe libraries alone (imported, no model): {libraries / gib:.2f} GiB peak RSS")
    print(f"the narrow twin's export: {floor / gib:.2f} GiB peak RSS\n")
    print(
        "| checkpoint | export s | peak RSS (GiB) | graph weights (GiB) "
        "| over the libraries / weights | over the narrow twin / weights |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for dtype, cost, size in rows:
        peak = cost["peak_rss"]
        print(
            f"| {dtype} | {cost['seconds']:.1f} | {peak / gib:.2f} | {size / gib:.2f} | "
            f"{(peak - libraries) / size:.2f}x | {(peak - floor) / size:.2f}x |"
        )


if __name__ == "__main__":
    main()
