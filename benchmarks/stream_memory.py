"""Does memory grow with the number of examples in `predict` and `eval`? Measured side by side.

A tiny BERT (uqcompress.models.tiny, untrained, labels neg/pos) predicts N generated texts for
each N. Columns: `predict` runs `steps.predict.write_predictions` into a file; `eval
predictions` runs what eval runs before its metrics (`engine.sources.predict_sharded`, one
process) and `kept` is the size of the arrays it returns (member logits, probs, entropy, MI);
`reading the CSV` is `data.load_data` of the same texts as a CSV (the data layer, which still
reads the whole set). Each number is the Python-heap peak during the run beyond what was
allocated before it (tracemalloc: Python objects and numpy arrays; torch's own tensor memory is
not counted, and holds one batch). Not a test; memory, not time, so it does not depend much
on the machine.

    .venv/bin/python benchmarks/stream_memory.py [--sizes 2000 8000] [--quick] [--markdown]
"""

from __future__ import annotations

import argparse
import csv
import io
import random
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path

WORDS = ["the", "film", "was", "great", "awful", "story", "acting", "fun", "boring", "very"]


def texts(n: int) -> list[str]:
    rng = random.Random(n)
    return [" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) for _ in range(n)]


def peak(run: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 8000])
    parser.add_argument("--quick", action="store_true", help="sizes 200 and 800")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    sizes = [200, 800] if args.quick else args.sizes

    from uqcompress.data import load_data
    from uqcompress.data.dataset import LabeledData
    from uqcompress.engine.sources import predict_sharded
    from uqcompress.export.source import open_source
    from uqcompress.steps import init
    from uqcompress.steps.predict import write_predictions

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = init.run(
            init.InitConfig(family="bert", labels=["neg", "pos"]), root / "bert"
        ).artifact.path
        source = open_source(model, "model", "cpu")
        rows = []
        for i, n in enumerate([sizes[0], *sizes]):  # the first run warms caches, not shown
            data = texts(n)
            examples = LabeledData(
                spec=f"generated:{n}",
                input_kind="text",
                labels=None,
                fingerprint=str(n),
                texts=data,
            )
            table = root / f"data{i}.csv"
            with table.open("w", newline="", encoding="utf-8") as handle:
                writer = csv.writer(handle)
                writer.writerow(["text", "label"])
                writer.writerows((t, "pos" if j % 2 else "neg") for j, t in enumerate(data))
            out = root / f"pred{i}.jsonl"
            predict_peak = peak(
                lambda: write_predictions(source, examples, 64, None, out, io.StringIO())  # noqa: B023
            )
            read_peak = peak(lambda: load_data(str(table)))  # noqa: B023
            labelled = load_data(str(table))
            eval_peak = peak(lambda: predict_sharded([source], labelled, 64, None))  # noqa: B023
            outputs = predict_sharded([source], labelled, 64, None)
            assert outputs is not None
            kept = sum(
                a.nbytes
                for a in (
                    outputs.member_logits,
                    outputs.probs,
                    outputs.entropy,
                    outputs.mutual_info,
                )
            )
            if i:
                rows.append((n, predict_peak, eval_peak, kept, read_peak))
    header = [
        "examples",
        "predict (MB)",
        "eval predictions (MB)",
        "kept arrays (MB)",
        "reading the CSV (MB)",
    ]
    lines = [header] + [[f"{n:,}", *(f"{v / 1e6:.2f}" for v in values)] for n, *values in rows]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for line in lines[1:]:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(row[k]) for row in lines) for k in range(len(header))]
        for line in lines:
            print("  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)))


if __name__ == "__main__":
    main()
