"""ONNX Runtime latency of real_text.py's exports, side by side in one run, on a quiet machine.

real_text.py measures each model's latency inside its own `uqc eval`, minutes apart, on a
machine that may be doing other work then; the Hydra floor (<= 0.8x the deep ensemble's ONNX
Runtime latency) needs the models timed together. This script takes a real_text work dir,
opens every calibrated export (`<row>-onnx`) and int8 model (`<row>-int8`), and times
`Predictor.run` (model only: texts encoded beforehand) on the same test batches, the models
interleaved round by round so that a load change hits all of them alike; the median round
counts. The deep ensemble has no single export: its latency is that of three single models
run one after another (3 x `single-onnx`), how such an ensemble is deployed.

    python benchmarks/real_text_latency.py WORK_DIR [--data-dir DIR] [--rounds 5]
        [--examples 256] [--threads 1]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BATCH = 64


def _texts(path: Path, n: int) -> list[str]:
    with path.open(encoding="utf-8") as handle:
        return [row["text"] for row in csv.DictReader(handle)][:n]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("work", type=Path, help="a real_text.py --work-dir")
    parser.add_argument(
        "--data-dir", type=Path, help="its test.csv's folder (default: WORK_DIR/data)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (1..50)")
    parser.add_argument("--examples", type=int, default=256, help="test texts (1..10,000)")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads (1..64)")
    args = parser.parse_args(argv)
    if not (1 <= args.rounds <= 50 and 1 <= args.examples <= 10_000 and 1 <= args.threads <= 64):
        parser.error("--rounds 1..50, --examples 1..10,000, --threads 1..64")
    from uqcompress.export.runtime import Predictor

    exports = sorted(
        p
        for p in args.work.iterdir()
        if p.name.endswith(("-onnx", "-int8")) and (p / "model.onnx").is_file()
    )
    if not any(p.name == "single-onnx" for p in exports):
        sys.exit(f"{args.work} has no single-onnx export: run benchmarks/real_text.py first")
    texts = _texts((args.data_dir or args.work / "data") / "test.csv", args.examples)
    models: dict[str, tuple[Any, list[dict[str, Any]]]] = {}
    for path in exports:
        predictor = Predictor(path, threads=args.threads)
        batches = []
        for i in range(0, len(texts), BATCH):
            inputs = predictor.encode_texts(texts[i : i + BATCH])
            if predictor.noise is not None:  # drawn before the clock: model only
                inputs["noise"] = predictor.draw_noise(inputs)
            batches.append(inputs)
        predictor.run(batches[0])  # warm-up
        models[path.name] = (predictor, batches)
    seconds: dict[str, list[float]] = {name: [] for name in models}
    load = os.getloadavg()[0]
    for _ in range(args.rounds):
        for name, (predictor, batches) in models.items():
            start = time.perf_counter()
            for inputs in batches:
                predictor.run(inputs)
            seconds[name].append(time.perf_counter() - start)
    ms = {name: 1000.0 * statistics.median(s) / len(texts) for name, s in seconds.items()}
    single = ms["single-onnx"]
    ensemble = 3 * single
    print(f"| model | ms/example | x single | x deep ensemble (3 x single = {ensemble:.2f} ms) |")
    print("|---|---|---|---|")
    for name, value in ms.items():
        print(f"| {name} | {value:.2f} | {value / single:.2f} | {value / ensemble:.2f} |")
    print(
        f"\n{len(texts)} test texts in batches of {BATCH}, {args.threads} thread(s), median of "
        f"{args.rounds} interleaved rounds; load {load:.2f} -> {os.getloadavg()[0]:.2f} on "
        f"{os.cpu_count()} CPUs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
