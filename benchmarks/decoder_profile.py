"""Where does the time of a dense and a 50%-pruned decoder go? ONNX Runtime's own profiler.

The decoder rows of docs/benchmarks.md (`benchmarks/decoder_cost.py`) once measured the pruned
Qwen2.5-0.5B-shaped classifier at 0.60x the dense one at batch 8, far below its FLOPs bound
(0.93x). This script exports the same two models (`decoder_cost.build`'s shape, pruned by
`prune_half`: one of the two key/value groups with its 7 query heads removed in every layer),
runs each at batch 1 and 8 with ONNX Runtime profiling on, and prints, side by side from one run:

- kernel time per op type (ms per forward pass, summed over the graph's nodes), dense,
  pruned and their ratio;
- the MatMul nodes grouped by their activation and output shapes (the projections): count,
  ms per pass.

Profiling adds a little overhead per node to both graphs alike. Timings depend on the machine
and its load; nothing asserts on them.

    .venv/bin/python benchmarks/decoder_profile.py [--layers 24] [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import decoder_cost

MAX_LAYERS = 24  # Qwen2.5-0.5B's depth: the benchmark's shape, never more
MAX_REPEATS = 50


def profiled_session(path: Path, prefix: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    options.profile_file_prefix = str(prefix)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def kernel_times(profile: Path) -> tuple[int, dict[str, float], dict[str, list[float]]]:
    """Runs, ms per run by op type, and [count, ms per run] of MatMuls by input shapes."""
    events = json.loads(profile.read_text())
    passes = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    warm = passes[0][1]  # the first pass is the warm-up: its nodes are left out
    runs = len(passes) - 1
    by_op: dict[str, float] = collections.defaultdict(float)
    matmul_ms: dict[str, float] = collections.defaultdict(float)
    matmul_nodes: dict[str, set[str]] = collections.defaultdict(set)
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        if event["ts"] < warm:
            continue
        op, ms = event["args"]["op_name"], float(event["dur"]) / runs / 1e3
        by_op[op] += ms
        if op in ("MatMul", "FusedMatMul"):
            shapes = [next(iter(d.values())) for d in event["args"].get("input_type_shape", [])]
            produced = [next(iter(d.values())) for d in event["args"].get("output_type_shape", [])]
            key = f"{op} {' x '.join(str(s) for s in shapes)} -> {produced[0] if produced else '?'}"
            matmul_ms[key] += ms
            matmul_nodes[key].add(event["name"])
    matmuls = {key: [float(len(matmul_nodes[key])), ms] for key, ms in matmul_ms.items()}
    return runs, dict(by_op), matmuls


def profile(path: Path, root: Path, label: str, batch: int, args: Any) -> Path:
    prefix = root / f"{label}-b{batch}"
    session = profiled_session(path, prefix, args.threads)
    names = {i.name for i in session.get_inputs()}
    feed = {k: v for k, v in decoder_cost.ort_feed(batch, args.vocab).items() if k in names}
    session.run(None, feed)  # the warm-up (kernel_times leaves it out)
    for _ in range(args.repeats):
        session.run(None, feed)
    return Path(session.end_profiling())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=MAX_LAYERS, help="blocks (1-24)")
    parser.add_argument("--repeats", type=int, default=5, help="profiled runs per batch")
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    args = parser.parse_args()
    if not 1 <= args.layers <= MAX_LAYERS or not 1 <= args.repeats <= MAX_REPEATS:
        sys.exit(f"--layers must be 1-{MAX_LAYERS} and --repeats 1-{MAX_REPEATS}")
    if not 1 <= args.threads <= 64:
        sys.exit("--threads must be 1-64")
    import torch

    from uqcompress.models.loading import quiet_transformers

    quiet_transformers()
    torch.set_num_threads(args.threads)
    decoder_cost.THREADS = args.threads
    from uqcompress.models.factory import create_model

    overrides = {"vocab_size": decoder_cost.QWEN_VOCAB, "num_hidden_layers": args.layers}
    dense = create_model("qwen2", ["neg", "pos"], "base", overrides, seed=0)
    args.vocab = int(dense.config.vocab_size)
    pruned = copy.deepcopy(dense)
    decoder_cost.prune_half(pruned)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = {}
        for label, model in (("dense", dense), ("pruned", pruned)):
            paths[label] = root / f"{label}.onnx"
            decoder_cost.export(model, paths[label])
        del dense, pruned
        print(
            f"Qwen2.5-0.5B shape, {args.layers} layers, sequence {decoder_cost.SEQUENCE}, "
            f"{args.threads} threads, {args.repeats} profiled runs"
        )
        for batch in (1, 8):
            found = {
                label: kernel_times(profile(path, root, label, batch, args))
                for label, path in paths.items()
            }
            (_, dense_ops, dense_mm), (_, pruned_ops, pruned_mm) = found["dense"], found["pruned"]
            total_d, total_p = sum(dense_ops.values()), sum(pruned_ops.values())
            print(
                f"\nbatch {batch}: kernel time dense {total_d:.1f} ms, pruned {total_p:.1f} ms,"
                f" pruned / dense {total_p / total_d:.2f}x"
            )
            print("| op | dense ms | pruned ms | pruned / dense |\n| --- | ---: | ---: | ---: |")
            for op in sorted(dense_ops, key=lambda o: -dense_ops[o])[:8]:
                d, p = dense_ops[op], pruned_ops.get(op, 0.0)
                print(f"| {op} | {d:.1f} | {p:.1f} | {p / d:.2f}x |")
            print("| graph | MatMul inputs | nodes | ms |\n| --- | --- | ---: | ---: |")
            for label, table in (("dense", dense_mm), ("pruned", pruned_mm)):
                for key, (count, ms) in sorted(table.items(), key=lambda kv: -kv[1][1])[:6]:
                    print(f"| {label} | {key} | {count:.0f} | {ms:.1f} |")


if __name__ == "__main__":
    main()
