"""How many torch threads should CPU training use? Measured side by side, in one run.

Trains the demo's ViT-small on builtin:digits@train with each thread count in a fresh
subprocess (so thread pools do not leak between runs), and prints seconds and the ratio
to the first count. Not a test: timings depend on the machine and what else runs on it.

    .venv/bin/python benchmarks/train_threads.py [--epochs 10] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def uqc(*args: str, env_root: Path) -> str:
    import os

    env = {**os.environ, "UQC_ARTIFACTS": str(env_root)}
    proc = subprocess.run(
        [sys.executable, "-m", "uqcompress", *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = uqc(
            "init", "--family", "vit", "--preset", "small", "--num-labels", "10", env_root=root
        ).strip()
        rows = []
        for run, threads in enumerate(args.threads):
            out = uqc(
                "finetune",
                model,
                "--data",
                "builtin:digits@train",
                "--epochs",
                str(args.epochs),
                "--lr",
                "1e-3",
                "--threads",
                str(threads),
                "--device",
                "cpu",
                "--out",
                str(root / f"run{run}-t{threads}"),
                "--json",
                env_root=root,
            )
            rows.append((threads, json.loads(out)["summary"]["train_seconds"]))
    base = rows[0][1]
    print(f"ViT-small, builtin:digits@train, {args.epochs} epochs, CPU")
    print(f"{'threads':>8} {'seconds':>10} {'ratio':>8}")
    for threads, seconds in rows:
        print(f"{threads:>8} {seconds:>10.2f} {seconds / base:>8.2f}")
    for threads in sorted(set(args.threads)):
        times = [s for t, s in rows if t == threads]
        print(
            f"threads={threads}: mean {sum(times) / len(times):.2f} s, "
            f"min {min(times):.2f} s, max {max(times):.2f} s over {len(times)} runs"
        )


if __name__ == "__main__":
    main()
