"""Rich tables on stderr."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from uqcompress.console import stderr

METRIC_COLUMNS = (
    ("acc", "acc", "{:.4f}"),
    ("nll", "NLL", "{:.4f}"),
    ("brier", "Brier", "{:.4f}"),
    ("ece", "ECE", "{:.4f}"),
    ("latency_ms", "ms/example", "{:.3f}"),
    ("parameters", "params", "{:,}"),
    ("members", "M", "{}"),
)


def print_metrics(rows: list[tuple[str, dict[str, Any]]], title: str = "evaluation") -> None:
    table = Table(title=title)
    table.add_column("model")
    for _, header, _ in METRIC_COLUMNS:
        table.add_column(header, justify="right")
    for name, metrics in rows:
        cells = [
            fmt.format(metrics[key]) if metrics.get(key) is not None else "-"
            for key, _, fmt in METRIC_COLUMNS
        ]
        table.add_row(name, *cells)
    stderr.print(table)
