"""Rich tables on stderr."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from uqcompress.runtime.console import plain, stderr

LEADING = (
    ("acc", "acc", "{:.3f}"),
    ("nll", "NLL", "{:.3f}"),
    ("brier", "Brier", "{:.3f}"),
    ("ece", "ECE", "{:.3f}"),
    ("aurc", "AURC", "{:.3f}"),
)
TRAILING = (
    ("latency_ms", "ms/ex", "{:.3f}"),  # model only, warm
    ("latency_e2e_ms", "e2e ms/ex", "{:.3f}"),  # with reading and preprocessing
    ("parameters", "params", "{:,}"),
    ("members", "M", "{}"),
)
TABLE_OOD_SCORE = "entropy"  # every model has it; MI needs M > 1
# An ensemble's mean uncertainty decomposition (eval reports it for M > 1 only).
UNCERTAINTY = (
    ("entropy", "entropy", "{:.3f}"),
    ("aleatoric", "aleatoric", "{:.3f}"),
    ("mi", "MI", "{:.3f}"),
)


def print_metrics(
    rows: list[tuple[str, dict[str, Any]]], title: str = "evaluation", ratio: bool = False
) -> None:
    """One row per model; an ensemble's mean entropy, aleatoric part and MI when any row is
    an ensemble; OOD columns (AUROC, FPR95 of predictive entropy) per OOD set; with `ratio`,
    the latency ratio to a baseline (`latency_ratio`) too."""
    columns: list[tuple[str, str, str]] = list(LEADING)
    if any("mi" in metrics for _, metrics in rows):
        columns += UNCERTAINTY
    from uqcompress.uq.metrics import ood_set_names

    sets = ood_set_names(metrics for _, metrics in rows)
    for name in sets:
        prefix = f"ood.{name}.{TABLE_OOD_SCORE}"
        columns += [
            (f"{prefix}.auroc", f"{name}\nAUROC", "{:.3f}"),
            (f"{prefix}.fpr95", f"{name}\nFPR95", "{:.3f}"),
        ]
    columns += TRAILING
    if ratio:
        columns.insert(len(columns) - 3, ("latency_ratio", "x base", "{:.2f}"))
    table = Table(title=plain(title), caption="OOD scored by predictive entropy" if sets else None)
    table.add_column("model", overflow="fold")
    for _, header, _ in columns:
        table.add_column(header, justify="right")
    for name, metrics in rows:
        cells = [
            fmt.format(metrics[key]) if metrics.get(key) is not None else "-"
            for key, _, fmt in columns
        ]
        table.add_row(plain(name), *cells)
    stderr.print(table)


def print_calibration(metrics: dict[str, Any]) -> None:
    """A calibrated model's line: NLL and ECE without / with its temperature, and the risk at
    its abstention threshold."""
    if "temperature" not in metrics:
        return
    stderr.print(
        f"calibrated (temperature {metrics['temperature']:.4g}): NLL "
        f"{metrics['nll_uncalibrated']:.3f} -> {metrics['nll']:.3f}, ECE "
        f"{metrics['ece_uncalibrated']:.3f} -> {metrics['ece']:.3f}",
        highlight=False,
    )
    if "abstain_coverage" in metrics:
        stderr.print(
            f"abstains on {1 - metrics['abstain_coverage']:.1%}: error rate "
            f"{metrics['abstain_risk']:.4f} on the {metrics['abstain_coverage']:.1%} answered "
            f"(all answered: {1 - metrics['acc']:.4f})",
            highlight=False,
        )
