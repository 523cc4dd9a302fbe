"""Data at scale: peak memory, wall time and data-wait share of `uqc finetune` and `uqc eval`
on a large folder of JPEGs of mixed sizes and on a large text CSV.

Generates (seeded) a folder of JPEGs, 100-600 px on each side, noise plus one of 10 shapes
per class, and a CSV of short texts in 10 classes; then runs, each in a fresh `uqc`
process whose process tree (workers included) is sampled with psutil every 50 ms:

- images: `uqc init` a tiny ViT for 224x224 RGB in 16x16 patches, one `finetune` epoch
  (`--workers W`), then `eval`; at two folder sizes, to show that memory does not grow with
  the number of images;
- text: a tiny BERT, one `finetune` epoch on the CSV, then `eval` on it.

Reports wall seconds, peak RSS of the main process, peak PSS of the whole tree (workers
included, shared pages counted once), and the share of
the training loop's time spent waiting for the next batch (`data_wait_seconds` /
`train_seconds` from the finetune summary). Not a test: timings depend on the machine and on
what else runs on it.

    .venv/bin/python benchmarks/data_scale.py [--quick] [--markdown] [--images 20000]
        [--rows 200000] [--workers 2] [--keep DIR [--generate-only]]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CLASSES = 10
WORDS = [
    "river stone cloud lamp paper glass road field winter copper",
    "quick slow bright dark warm cold heavy light loud quiet",
    "apple bread cheese honey lemon olive pepper rice salt sugar",
    "engine wheel brake clutch gear piston valve pump belt chain",
    "violin drum flute guitar piano harp horn organ cello bass",
    "north south east west up down left right inside outside",
    "red green blue yellow purple orange black white grey pink",
    "cat dog horse mouse bird fish snake frog bear wolf",
    "run jump swim climb walk crawl fly dive roll slide",
    "one two three four five six seven eight nine ten",
]


# -- data -------------------------------------------------------------------------------------


def _draw_chunk(task: tuple[str, int, int, int]) -> int:
    """Write JPEGs `start..stop-1` into `root/<class>/`: seeded noise plus the class's shape."""
    from PIL import Image, ImageDraw

    root, start, stop, seed = task
    for i in range(start, stop):
        rng = np.random.default_rng((seed, i))
        label = i % CLASSES
        width, height = (int(v) for v in rng.integers(100, 601, size=2))
        # noise drawn small and scaled up: cheap, and textured like a photo
        small = rng.integers(0, 256, size=(height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
        image = Image.fromarray(small, "RGB").resize((width, height), Image.Resampling.BILINEAR)
        draw = ImageDraw.Draw(image)
        side = min(width, height) * float(rng.uniform(0.3, 0.7))
        cx = float(rng.uniform(side / 2, width - side / 2))
        cy = float(rng.uniform(side / 2, height - side / 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        if label == 0:
            draw.ellipse((cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2), fill=colour)
        else:  # a regular polygon with label + 2 corners (1 -> triangle, ...)
            draw.regular_polygon((cx, cy, side / 2), label + 2, fill=colour)
        folder = Path(root) / str(label)
        image.save(folder / f"{i:06d}.jpg", quality=90)
    return stop - start


def make_images(root: Path, count: int, seed: int = 0, jobs: int = 2) -> None:
    for label in range(CLASSES):
        (root / str(label)).mkdir(parents=True, exist_ok=True)
    step = 500
    tasks = [(str(root), s, min(count, s + step), seed) for s in range(0, count, step)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(_draw_chunk, tasks))


def make_csv(path: Path, rows: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    vocab = [line.split() for line in WORDS]
    shared = " ".join(WORDS).split()
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        labels = rng.integers(0, CLASSES, size=rows)
        lengths = rng.integers(5, 40, size=rows)
        for label, length in zip(labels, lengths, strict=True):
            own = rng.choice(vocab[label], size=max(1, length // 3))
            noise = rng.choice(shared, size=length - len(own))
            words = np.concatenate([own, noise])
            rng.shuffle(words)
            writer.writerow([" ".join(words), f"c{label}"])


# -- measuring --------------------------------------------------------------------------------


@dataclass
class Run:
    what: str
    seconds: float
    main_peak_mb: float
    tree_peak_mb: float
    summary: dict[str, object]
    path: str


def run_uqc(args: list[str], env: dict[str, str]) -> Run:
    """Run `uqc ARGS --json`, sampling the RSS of the process and its children every 50 ms."""
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "uqcompress", *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    peaks = {"main": 0, "tree": 0}
    done = threading.Event()

    def sample() -> None:
        # main: RSS of the uqc process; tree: PSS summed over it and its workers (pages
        # shared after fork counted once, split between the processes that share them)
        try:
            main = psutil.Process(proc.pid)
        except psutil.NoSuchProcess:
            return
        while not done.is_set():
            try:
                rss = main.memory_info().rss
                tree = main.memory_full_info().pss
                for child in main.children(recursive=True):
                    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                        tree += child.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                return
            peaks["main"] = max(peaks["main"], rss)
            peaks["tree"] = max(peaks["tree"], tree)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    done.set()
    sampler.join()
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"uqc {' '.join(args)} failed ({proc.returncode}):\n{err[-3000:]}")
    result = json.loads(out)
    summary = result.get("summary", {})
    print(
        f"done: uqc {args[0]} {args[3]}: {seconds:.1f} s, peak RSS "
        f"{peaks['main'] / 2**20:.0f} MB, train {summary.get('train_seconds', '-')} s, "
        f"data wait {summary.get('data_wait_seconds', '-')} s",
        file=sys.stderr,
        flush=True,
    )
    return Run(
        what=args[0],
        seconds=seconds,
        main_peak_mb=peaks["main"] / 2**20,
        tree_peak_mb=peaks["tree"] / 2**20,
        summary=result.get("summary", {}),
        path=str(result["path"]),
    )


def path_of(out: str) -> str:
    text = out.strip()
    return str(json.loads(text)["path"]) if text.startswith("{") else text


def init(args: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "uqcompress", "init", *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return path_of(proc.stdout)


# -- main -------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 400 images, 4,000 rows")
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    parser.add_argument("--images", type=int, help="JPEGs in the folder (default 20,000)")
    parser.add_argument("--rows", type=int, help="rows in the text CSV (default 200,000)")
    parser.add_argument("--workers", type=int, default=2, help="--workers for uqc (default 2)")
    parser.add_argument("--batch-size", type=int, default=64, help="default 64")
    parser.add_argument(
        "--small-share",
        type=float,
        default=0.1,
        help="the smaller folder, as a share of --images, for the memory comparison",
    )
    parser.add_argument("--keep", type=Path, help="generate into (or reuse) this folder")
    parser.add_argument("--skip-text", action="store_true", help="images only")
    parser.add_argument("--skip-images", action="store_true", help="text only")
    parser.add_argument(
        "--generate-only", action="store_true", help="write the data into --keep and stop"
    )
    args = parser.parse_args()
    if args.images is None:
        args.images = 400 if args.quick else 20_000
    if args.rows is None:
        args.rows = 4_000 if args.quick else 200_000
    return args


def main() -> None:
    args = parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="uqc-data-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "UQC_ARTIFACTS": str(work / "artifacts")}
    small_count = max(CLASSES, int(args.images * args.small_share))
    folders = {n: work / f"images-{n}" for n in sorted({small_count, args.images})}
    if args.skip_images:
        folders = {}
    made: dict[str, float] = {}
    for count, folder in folders.items():
        if not (folder / "0").is_dir():
            start = time.perf_counter()
            make_images(folder, count)
            made[f"{count:,} JPEGs"] = time.perf_counter() - start
    table = work / f"text-{args.rows}.csv"
    if not args.skip_text and not table.is_file():
        start = time.perf_counter()
        make_csv(table, args.rows)
        made[f"{args.rows:,}-row CSV"] = time.perf_counter() - start
    for what, seconds in made.items():
        print(f"generated {what} in {seconds:.1f} s", file=sys.stderr)
    if args.generate_only:
        return

    common = ["--workers", str(args.workers), "--batch-size", str(args.batch_size)]
    common += ["--device", "cpu"]
    labels = ",".join(str(c) for c in range(CLASSES))
    vit_args = ["--family", "vit", "--preset", "tiny", "--image-size", "224"]
    vit_args += ["--patch-size", "16", "--set", "num_channels=3", "--labels", labels]
    vit = init(vit_args, env)
    rows: list[tuple[str, Run]] = []
    for count, folder in folders.items():
        train = run_uqc(["finetune", vit, "--data", str(folder), "--epochs", "1", *common], env)
        rows.append((f"images, {count:,} JPEGs: finetune 1 epoch", train))
        if count == args.images:
            tested = run_uqc(["eval", train.path, "--data", str(folder), *common], env)
            rows.append((f"images, {count:,} JPEGs: eval", tested))
    if not args.skip_text:
        names = ",".join(f"c{c}" for c in range(CLASSES))
        bert = init(["--family", "bert", "--preset", "tiny", "--labels", names], env)
        train = run_uqc(["finetune", bert, "--data", str(table), "--epochs", "1", *common], env)
        rows.append((f"text, {args.rows:,} rows: finetune 1 epoch", train))
        tested = run_uqc(["eval", train.path, "--data", str(table), *common], env)
        rows.append((f"text, {args.rows:,} rows: eval", tested))

    print(
        f"\nuqc data at scale: --workers {args.workers}, --batch-size {args.batch_size}, CPU, "
        f"{os.cpu_count()} cores; tiny ViT 224x224 RGB (16x16 patches), tiny BERT"
    )
    head = f"{'run':<44} {'wall s':>8} {'train s':>8} {'wait %':>7} {'main MB':>8} {'all MB':>8}"
    print(head)
    lines = []
    for name, run in rows:
        train_s = run.summary.get("train_seconds")
        wait_s = run.summary.get("data_wait_seconds")
        share = (
            f"{100 * float(wait_s) / float(train_s):.1f}"  # type: ignore[arg-type]
            if train_s and wait_s is not None
            else "-"
        )
        train_text = f"{float(train_s):.1f}" if train_s else "-"  # type: ignore[arg-type]
        print(
            f"{name:<44} {run.seconds:>8.1f} {train_text:>8} {share:>7} "
            f"{run.main_peak_mb:>8.0f} {run.tree_peak_mb:>8.0f}"
        )
        lines.append(
            f"| {name} | {run.seconds:.1f} | {train_text} | {share} | "
            f"{run.main_peak_mb:,.0f} | {run.tree_peak_mb:,.0f} |"
        )
    if args.markdown:
        print(
            "\n| run | wall s | train s | data wait % | peak RSS, main (MB) "
            "| peak PSS, all processes (MB) |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
