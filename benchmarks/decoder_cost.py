"""What do scoring, pruning, Hydra and SVE cost on a decoder LLM classifier? One run, on CPU.

The model: a random Qwen2.5-0.5B-shaped classifier (`qwen2` family, `base` preset: 24 layers,
hidden 896, 14 query heads over 2 key/value heads, SwiGLU MLP 4864, its 151,936-token
vocabulary; 2 labels), at sequence 128. Measured side by side:

1. The steps as a user runs them, each in its own process (wall seconds and peak RSS, the
   process's own high-water mark): `uqc init --family qwen2 --preset base` (writes the
   model artifact), `uqc score --method hies` on 32 texts of 128 tokens (batch 8), and `uqc
   prune --ratio 0.5 --unit kv` (one of the two key/value heads with its 7 query heads, in
   every layer; `--unit query` removes tiers of 2 heads, so 6 or 8 of the 14, not 7), which
   includes its pruned-vs-gated parity check and writing the artifact.
2. (the pruned model of step 3 is pruned the same way, by seeded random scores.)
3. ONNX Runtime CPU latency (median of `--repeats` runs after `--warmup`, configurations
   taking turns of 5 runs), batch 1 and 8: the dense model, the 50%-pruned one, a Hydra model
   of M=3 members (each keeping 2 of the 7 tiers of every layer, i.e. 4 of 14 query heads, the
   members sharing no head) and a deep ensemble (the dense model run 3 times). Ratios from the
   same run: pruned / dense, Hydra / deep ensemble. The exports hold more than 1.8 GB of
   weights, so they use ONNX external data. The parity columns: max |member logits| between
   ONNX Runtime and torch (batch 1), and, for Hydra, fused vs its members run alone.
4. SVE with M=4 members on the paper's LLaMA targets (q, k, v, o, gate, up, down): the
   parameter overhead (what M members add over one model, divided by the base's parameters)
   and torch CPU latency at batch 8 against the dense model's.

`--quick` keeps the shapes but 2 layers and a 32,000-token vocabulary, 3 repeats: a wiring
check in a few minutes. Timings depend on the machine and its load; nothing asserts on them.

    .venv/bin/python benchmarks/decoder_cost.py [--quick] [--threads 2] [--steps-only]

`--steps-only` measures only the per-step table, for the 0.5B shape in float32 and in
bfloat16 (`--dtype`) side by side, and for a Qwen2.5-1.5B shape (28 layers, hidden 1536,
12 query heads over 2 key/value heads, MLP 8960) written as a bfloat16 checkpoint: init,
score --method hies, prune --unit kv, svd-ensemble (one optimizer step, M=4) and export,
each step with `--dtype auto` (bfloat16 above 1B parameters).
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from hydra_cost import interleaved_medians, member_keeps, ort_runner

SEQUENCE = 128
EXAMPLES = 32
BATCH = 8
MEMBERS = 3
SVE_MEMBERS = 4
QWEN_VOCAB = 151936


def build(quick: bool, seed: int = 0) -> Any:
    from uqcompress.models.factory import create_model

    overrides: dict[str, Any] = {"vocab_size": 32000 if quick else QWEN_VOCAB}
    if quick:
        overrides["num_hidden_layers"] = 2
    return create_model("qwen2", ["neg", "pos"], "base", overrides, seed=seed)


def write_texts(path: Path, count: int, seed: int) -> Path:
    """A labelled CSV of `count` texts of about SEQUENCE tokens (random words of the shipped
    vocabulary, so the shipped tokenizer gives one token per word)."""
    import csv
    import random

    from uqcompress.models.tokenizer import shipped_vocab_path

    words = [w for w in shipped_vocab_path().read_text().split() if w.isalpha()]
    rng = random.Random(seed)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        for i in range(count):
            text = " ".join(rng.choices(words, k=SEQUENCE - 2))  # + [CLS] and [SEP]
            writer.writerow([text, "neg" if i % 2 else "pos"])
    return path


def measured(args: list[str], threads: int) -> dict[str, float]:
    """Run `uqc ARGS` in a fresh process: its wall seconds and peak RSS (the child's
    ru_maxrss, read by a fresh parent, so no other child counts)."""
    probe = (
        "import resource, subprocess, sys, time; start = time.perf_counter(); "
        "code = subprocess.run(sys.argv[1:]).returncode; "
        "print(code, time.perf_counter() - start, "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)"
    )
    command = [sys.executable, "-c", probe, sys.executable, "-m", "uqcompress", *args]
    if args[0] != "init":  # init runs no model
        command += ["--threads", str(threads)]
    proc = subprocess.run(command, capture_output=True, text=True)
    code, seconds, peak = proc.stdout.split()[-3:]
    if int(code) != 0:
        raise SystemExit(f"uqc {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return {"seconds": float(seconds), "peak_rss": float(peak)}


# Qwen2.5 shapes (random weights): the qwen2 family's base preset is the 0.5B one.
SIZES: dict[str, dict[str, int]] = {
    "0.5b": {},
    "1.5b": {
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
    },
}


def steps_cost(
    quick: bool, threads: int, root: Path, size: str = "0.5b", dtype: str = "float32"
) -> dict[str, dict[str, float]]:
    """`uqc init` (its weights written as `dtype`, as a checkpoint stores them), `uqc score
    --method hies` on EXAMPLES texts and `uqc prune --ratio 0.5 --unit kv`, and for the 1.5B
    shape also `uqc svd-ensemble` (one optimizer step, M=4) and `uqc export`, each in its
    own process with `--dtype auto` (the 1.5B checkpoint's bfloat16; the 0.5B one is under
    1B, so `--dtype` is passed): what a user's run costs, artifacts written."""
    data = write_texts(root / "calib.csv", EXAMPLES, seed=1)
    init = ["init", "--family", "qwen2", "--preset", "base", "--labels", "neg,pos"]
    init += ["--set", f"vocab_size={32000 if quick else QWEN_VOCAB}", "--dtype", dtype]
    for key, value in SIZES[size].items():
        init += ["--set", f"{key}={value}"]
    if quick:
        init += ["--set", "num_hidden_layers=2"]
    costs = {"init": measured([*init, "--out", str(root / "model")], threads)}
    compute = ["--dtype", "auto" if size != "0.5b" else dtype]
    score = ["score", str(root / "model"), "--method", "hies", "--data", str(data)]
    score += ["--calib-size", str(EXAMPLES), "--batch-size", str(BATCH), *compute]
    costs["score --method hies"] = measured([*score, "--out", str(root / "scores")], threads)
    prune = ["prune", str(root / "scores"), "--ratio", "0.5", "--unit", "kv", *compute]
    costs["prune --ratio 0.5"] = measured([*prune, "--out", str(root / "pruned")], threads)
    if size == "0.5b":
        return costs
    sve = ["svd-ensemble", str(root / "model"), "--data", str(data), "--members", "4"]
    sve += ["--max-steps", "1", "--batch-size", str(BATCH), *compute]
    costs["svd-ensemble (1 step)"] = measured([*sve, "--out", str(root / "sve")], threads)
    export = ["export", str(root / "pruned"), "--out", str(root / "onnx")]
    costs["export (the pruned model)"] = measured(export, threads)
    return costs


def print_steps(costs: dict[str, dict[str, float]], title: str) -> None:
    gib = 1 << 30
    print(f"\n{title}\n")
    print("| step (one process each) | seconds | peak RSS (GiB) |\n| --- | --- | --- |")
    for name, cost in costs.items():
        print(f"| uqc {name} | {cost['seconds']:.1f} | {cost['peak_rss'] / gib:.2f} |")


def prune_half(loaded: Any) -> None:
    """50% of every layer's query heads by seeded random scores: with 14 query heads over 2
    key/value heads, that is one whole key/value group (`--unit kv`; in tiers of 2 heads,
    `--unit query` could remove 6 or 8 of the 14, not 7)."""
    from uqcompress.methods.pruning import select_grouped_heads
    from uqcompress.methods.scoring import random_scores
    from uqcompress.models.head_gates import head_groups
    from uqcompress.models.surgery import prune_heads

    groups = head_groups(loaded)
    scores = random_scores(len(groups.heads), groups.heads[0], seed=0)
    prune_heads(loaded, select_grouped_heads(scores, groups, 0.5, unit="kv"))


def export(loaded: Any, path: Path) -> Any:
    """The contract graph of `loaded`, exported to `path`; returns an ORT session."""
    import onnxruntime as ort

    from uqcompress.export.graph import graph_for
    from uqcompress.export.onnx import export_graph

    graph = graph_for(loaded.model, "text")
    export_graph(graph, loaded, path, 18)
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    return graph, ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_feed(batch: int, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    ids = rng.integers(5, vocab, size=(batch, SEQUENCE), dtype=np.int64)
    return {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "token_type_ids": np.zeros_like(ids),
    }


def gap(graph: Any, session: Any, feed: dict[str, np.ndarray]) -> float:
    import torch

    with torch.inference_mode():
        reference = graph(**{k: torch.from_numpy(v) for k, v in feed.items()})[0].numpy()
    return float(np.abs(session.run(["member_logits"], feed)[0] - reference).max())


def hydra_of(base: Any) -> tuple[Any, float]:
    """Hydra of MEMBERS members dealt tiers of the base's query heads (no shared head;
    `hydra_cost.member_keeps`: 2 tiers, 4 of 14 heads each)."""
    import torch

    from uqcompress.methods.hydra import fuse
    from uqcompress.models.surgery import prune_heads

    keeps = member_keeps(base, MEMBERS)
    members = []
    for kept in keeps:
        member = copy.deepcopy(base)
        prune_heads(member, kept)
        members.append(member)
    hydra = fuse(members)
    check = {k: torch.from_numpy(v) for k, v in ort_feed(1, int(base.config.vocab_size)).items()}
    with torch.inference_mode():
        fused = hydra.model(**check).member_logits
        alone = torch.stack([m.model(**check).logits for m in members], dim=1)
    return hydra, float((fused - alone).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--steps-only",
        action="store_true",
        help="only the per-step table: the 0.5B shape in float32 and bfloat16 side by side, "
        "then the 1.5B shape (bfloat16 checkpoint, --dtype auto)",
    )
    args = parser.parse_args()
    global THREADS
    THREADS = args.threads
    import torch

    torch.set_num_threads(args.threads)
    repeats = args.repeats or (3 if args.quick else 10)
    began = time.perf_counter()
    if args.steps_only:
        steps_table(args.quick, args.threads)
        print(f"\nsteps only, {args.threads} threads, {time.perf_counter() - began:.0f} s")
        return
    with tempfile.TemporaryDirectory() as tmp:
        costs = steps_cost(args.quick, args.threads, Path(tmp))
    print_steps(costs, "Qwen2.5-0.5B shape, float32")

    from uqcompress.export.graph import graph_for
    from uqcompress.methods.sve import build_sve, parameter_report

    dense = build(args.quick)
    vocab = int(dense.config.vocab_size)
    params = sum(p.numel() for p in dense.model.parameters())
    print(f"model: {params / 1e6:.1f}M parameters, {len(dense.family.blocks(dense.model))} layers")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dense_graph, dense_session = export(dense, root / "dense.onnx")
        pruned = copy.deepcopy(dense)
        prune_half(pruned)
        pruned_graph, pruned_session = export(pruned, root / "pruned.onnx")
        del pruned
        hydra, fusion_gap = hydra_of(dense)
        hydra_graph, hydra_session = export(hydra, root / "hydra.onnx")
        del hydra
        sizes = {p.name: p.stat().st_size for p in root.iterdir()}
        print("files (MB): " + ", ".join(f"{k} {v / 1e6:.0f}" for k, v in sorted(sizes.items())))
        rows = []
        for batch in (1, 8):
            feed = ort_feed(batch, vocab)
            runners = [
                ort_runner([dense_session], feed),
                ort_runner([pruned_session], feed),
                ort_runner([hydra_session], feed),
                ort_runner([dense_session] * MEMBERS, feed),  # the deep ensemble
            ]
            times = interleaved_medians(runners, args.warmup, repeats)
            rows.append((batch, *times))
        one = ort_feed(1, vocab)
        pairs = [(dense_graph, dense_session), (pruned_graph, pruned_session)]
        gaps = [gap(g, s, one) for g, s in [*pairs, (hydra_graph, hydra_session)]]
    header = ["batch", "dense ms", "pruned 50% ms", "pruned / dense", "Hydra M=3 ms"]
    header += ["deep ensemble M=3 ms", "Hydra / ensemble"]
    print("\n| " + " | ".join(header) + " |\n|" + " --- |" * len(header))
    for batch, d, p, h, e in rows:
        cells = [f"{batch}", f"{d * 1e3:.1f}", f"{p * 1e3:.1f}", f"{p / d:.2f}x"]
        cells += [f"{h * 1e3:.1f}", f"{e * 1e3:.1f}", f"{h / e:.2f}x"]
        print("| " + " | ".join(cells) + " |")
    print(
        f"\nparity (max |member logits|): ORT vs torch dense {gaps[0]:.1e}, pruned "
        f"{gaps[1]:.1e}, Hydra {gaps[2]:.1e}; Hydra fused vs members {fusion_gap:.1e}"
    )

    sve = build_sve(dense, SVE_MEMBERS, "default", None, 0.01, 0)
    report = parameter_report(dense.model, sve.model)
    feed8 = {k: torch.from_numpy(v) for k, v in ort_feed(8, vocab).items()}
    dense_run = graph_for(dense.model, "text")
    sve_run = graph_for(sve.model, "text")
    with torch.inference_mode():
        base_t, sve_t = interleaved_medians(
            [lambda: dense_run(**feed8), lambda: sve_run(**feed8)], 1, max(3, repeats // 2)
        )
    print(
        f"SVE M={SVE_MEMBERS} (q, k, v, o, gate, up, down): parameter overhead "
        f"{report.overhead:.2%}; torch batch 8: {sve_t * 1e3:.0f} ms vs dense "
        f"{base_t * 1e3:.0f} ms ({sve_t / base_t:.2f}x)"
    )
    mode = "quick" if args.quick else "full"
    seconds = time.perf_counter() - began
    print(f"\n{mode} run, {args.threads} threads, {repeats} repeats, {seconds:.0f} s")


def steps_table(quick: bool, threads: int) -> None:
    """The per-step costs: the 0.5B shape in float32 and in bfloat16 (HIES's ratio is the
    one a user weighs), then the 1.5B shape from a bfloat16 checkpoint."""
    runs: dict[str, dict[str, dict[str, float]]] = {}
    for dtype in ("float32", "bfloat16"):
        with tempfile.TemporaryDirectory() as tmp:
            runs[dtype] = steps_cost(quick, threads, Path(tmp), "0.5b", dtype)
        print_steps(runs[dtype], f"Qwen2.5-0.5B shape, {dtype}")
    hies = "score --method hies"
    ratio = runs["bfloat16"][hies]["seconds"] / runs["float32"][hies]["seconds"]
    print(f"\nHIES bfloat16 / float32 seconds: {ratio:.2f}x")
    with tempfile.TemporaryDirectory() as tmp:
        large = steps_cost(quick, threads, Path(tmp), "1.5b", "bfloat16")
    print_steps(large, "Qwen2.5-1.5B shape, bfloat16 checkpoint, --dtype auto")


THREADS = 2

if __name__ == "__main__":
    main()
