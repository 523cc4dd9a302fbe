"""What does a Singular Value Ensemble cost on CPU next to one model and a deep ensemble? One run.

For a BERT-base-shaped classifier (2 labels, sequence 128, bert-base-uncased's 30522-token
vocabulary; the `BERT-base` shape of `prune_speed.py`), random, and for M = 4 and 8 members
(`--members`), four ways to get predictions are measured side by side:

- single: one dense model, seed `--seed`;
- deep ensemble: that same dense model run M times, one pass after another. Only latency is
  timed, and it does not depend on the weights' values: M different models would cost the same,
  as long as a layer's weights are out of the caches before the next pass needs them again
  (full mode: 400+ MB of weights per pass; quick mode's 2 layers are about 155 MB). One export
  instead of M keeps the run short; sizes count M copies. Averaging the members' probabilities
  is not timed (negligible);
- SVE factorised: `methods.sve.build_sve` of the single model (default targets: Q, K, V, O and
  both MLP projections of every layer; full rank; sigma_init 0.01, `uqc svd-ensemble`'s
  default), as built: the inputs repeated M times into the batch, every target computed as
  `x V`, scaled by member m's singular values s_m, then `U^T` (U and V stored once);
- SVE materialised: `methods.sve.materialize` of that model, the same function with each target
  a dense grouped weight `[M, in, out]` (member m's V diag(s_m) U^T), one batched GEMM.

Every configuration runs what `export.graph.graph_for` wraps around its model (member logits,
probabilities, entropy, mutual information), in torch and, exported at opset 18, in ONNX
Runtime. Per configuration:

1. values stored: parameters plus floating-point buffers (SVE's frozen U and V are buffers),
   as `LoadedModel.num_parameters` counts them; a deep ensemble M x single. For SVE also, from
   `methods.sve.parameter_report`: trainable (singular values, member biases and heads of all
   M members) and extra = what M members add over one model, (M - 1) x one member's own
   parameters, checked against `overhead_closed_form`. The overhead is given twice: extra over
   ALL base parameters (embeddings included), and extra over the weights of the target layers
   only, which at full rank and I = 4d is the paper's per-layer closed form
   (M - 1) 5 / (4 d) (`overhead_paper_fraction`; 1.14% at d = 768, M = 8);
2. ONNX file size: the opset-18 file `export.onnx.export_graph` writes (a deep ensemble:
   M x the single file). `export_graph` writes one self-contained file, and protobuf cannot hold
   one of 2 GiB or more: a configuration whose weights reach that (full mode, materialised
   M = 8: about 2.8 GB) is not exported and has no ONNX Runtime numbers;
3. analytic FLOPs per example (below);
4. torch eager CPU latency: median wall time of one batch under `torch.inference_mode`, over
   `--repeats` runs after `--warmup`, batch 1 and 8, `--threads` torch threads;
5. ONNX Runtime CPU latency: the same, CPUExecutionProvider with `--threads` intra-op threads.
   Within one engine and batch size, all configurations take turns of 5 timed runs, so load
   spikes hit them alike; each turn starts with an untimed run (the first turn with the
   `--warmup` runs), so no configuration pays for the previous one's caches and thread pool
   (`hydra_cost.interleaved_medians`).

Ratios to the single model and to the deep ensemble of the same M are taken from numbers of the
same run. Two parity columns guard against timing a wrong graph: for SVE, the largest |member
logit| difference between the factorised and the materialised model in torch (batch 1; float32
rounding, below 1e-6 on BERT-base); for every exported configuration, the largest |member
logit| difference between ONNX Runtime and torch on that input.

FLOPs, counted as 2 x multiply-adds of the matrix products, per example with T tokens, as in
`prune_speed.forward_flops` (LayerNorm, softmax, GELU, biases, residual adds and the per-member
scaling by s_m are elementwise and left out). With hidden size D, MLP size I, H heads of size d:

    single:  per layer 4 T D (H d) + 2 H T^2 d + 2 T D I;  pooler + classifier D^2 + D C_out
             (embeddings are table lookups: 0)
    deep ensemble:  M x single
    SVE:     M x single, with each target's T in*out replaced by
             factorised:   T r (in + out)   (x V then U^T, r = min(in, out) at full rank)
             materialised: T in*out         (so FLOPs are exactly the deep ensemble's)

because every member runs its own stream through every layer (the inputs are repeated M times
into the batch), attention scores, pooler and classifier included. At full rank a D x D target
costs 2 D^2 instead of D^2 and a D x 4D one 5 D^2 instead of 4 D^2 per token: in the target
layers factorised SVE does 1.5x the FLOPs of materialised SVE (18 D^2 against 12 D^2 per token
and layer), which does as many as a deep ensemble.

`--quick` is a smoke run (about 60 s on 2 idle cores): 2 layers of the BERT-base shape
(per-layer ratios are the real ones; embeddings weigh more in sizes and overhead), M = 4 only,
3 repeats after 1 warm-up. Full mode is the same code at 12 layers, M = 4 and 8 and 10 repeats
after 2 warm-ups: about 25 minutes on 2 idle cores (10 with `--repeats 3 --warmup 1`; a batch-8
pass of SVE factorised M = 8 alone is about 12 dense ones), and several GB of memory (the
materialised M = 8 model alone holds 2.8 GB of weights). Timings depend on the machine and
what else runs on it (torch with `--threads` equal to the core count slows down badly when
another process takes a core; `--threads 1` suffers less), so the first output line says how
many CPU-seconds other processes used during the run (Linux). Nothing here asserts on timings.

    .venv/bin/python benchmarks/sve_cost.py [--quick] [--markdown] [--threads 2] [--members 4 8]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Run as a script, this file's folder is on sys.path: the sibling benchmarks import as modules.
from hydra_cost import interleaved_medians, ort_runner, ort_torch_gap, torch_inputs, torch_runner
from prune_speed import (
    BATCHES,
    OPSET,
    Shape,
    Table,
    environment_line,
    forward_flops,
    num_tokens,
    ort_inputs,
    ort_session,
    print_report,
    pruning_shapes,
    stderr_logger,
)

if TYPE_CHECKING:
    from torch import nn

    from uqcompress.methods.sve import ParameterReport
    from uqcompress.models.loading import LoadedModel
    from uqcompress.models.sve_model import SVEModel

MEMBERS_FULL = (4, 8)
MEMBERS_QUICK = (4,)
SIGMA_INIT = 0.01  # `uqc svd-ensemble`'s default
TARGETS = "default"  # Q, K, V, O and both MLP projections of every layer
FLOAT_BYTES = 4
PROTOBUF_LIMIT = 2**31  # bytes: a self-contained .onnx file must stay below this
SINGLE, ENSEMBLE = "single", "deep ensemble"
FACTORISED, MATERIALISED = "SVE factorised", "SVE materialised"


@dataclass
class Config:
    """What one row runs: `graphs` one after another, exported to the files `paths`."""

    kind: str  # SINGLE, ENSEMBLE, FACTORISED or MATERIALISED
    members: int
    stored: int  # parameters plus floating-point buffers (a deep ensemble: M x single)
    flops: int
    graphs: list[nn.Module]
    paths: list[Path]
    report: ParameterReport | None = None  # SVE only
    closed_form: int | None = None  # SVE only: `overhead_closed_form` for this shape and M
    target_overhead: float | None = None  # SVE only: extra / weights of the target layers
    paper_overhead: float | None = None  # SVE only: `overhead_paper_fraction(d, M)`
    member_gap: float | None = None  # SVE only: max |member logits| factorised vs materialised

    @property
    def exportable(self) -> bool:
        """Whether its weights fit one self-contained ONNX file (see the module docstring)."""
        per_file = self.stored // len(self.paths)
        return per_file * FLOAT_BYTES < PROTOBUF_LIMIT

    @property
    def label(self) -> str:
        return self.kind if self.kind == SINGLE else f"{self.kind} M={self.members}"


@dataclass
class CostRow:
    """One configuration, measured; latencies in seconds per batch size, None where not run."""

    config: Config
    onnx_bytes: int | None
    torch_latency: dict[int, float]
    ort_latency: dict[int, float] | None
    ort_gap: float | None  # max |member logits| ONNX Runtime vs torch, batch 1


# --------------------------------------------------------------------------- models


def stored_values(module: nn.Module) -> int:
    """Parameters plus floating-point buffers, as `LoadedModel.num_parameters` counts them."""
    buffers = sum(b.numel() for b in module.buffers() if b.is_floating_point())
    return sum(p.numel() for p in module.parameters()) + buffers


def target_overhead(sve: SVEModel) -> float:
    """(M - 1) x one member's singular values and biases over the target layers' dense weights.

    At full rank and I = 4d this is the paper's per-layer fraction (M - 1) 5 / (4 d).
    """
    from uqcompress.models.sve_model import SVDLinear

    layers = [m for m in sve.modules() if isinstance(m, SVDLinear)]
    own = sum(m.singular_values.shape[1] + m.bias.shape[1] for m in layers)
    weights = sum(m.in_features * m.out_features for m in layers)
    return (sve.members - 1) * own / weights


def sve_flops(base: LoadedModel, sve: SVEModel, tokens: int, materialised: bool) -> int:
    """FLOPs of one example through the SVE model (formula in the module docstring)."""
    from uqcompress.models.sve_model import SVDLinear

    delta = 0  # multiply-adds per token over the base's in*out of every target
    if not materialised:
        for module in sve.modules():
            if isinstance(module, SVDLinear):
                rows, cols = module.in_features, module.out_features
                delta += module.rank * (rows + cols) - rows * cols
    return sve.members * (forward_flops(base, tokens) + 2 * tokens * delta)


def forms_gap(factorised: SVEModel, materialised: SVEModel, inputs: dict[str, Any]) -> float:
    """Largest |member logits| difference between the two forms of one SVE model."""
    import torch

    with torch.inference_mode():
        a = factorised(**inputs).member_logits
        b = materialised(**inputs).member_logits
    return float((a - b).abs().max())


def sve_configs(
    base: LoadedModel, members: int, args: argparse.Namespace, tmp: Path
) -> list[Config]:
    """The factorised and the materialised SVE of `base` with `members` members."""
    from uqcompress.export.graph import graph_for
    from uqcompress.methods.sve import (
        build_sve,
        materialize,
        overhead_closed_form,
        overhead_paper_fraction,
        parameter_report,
    )

    config = base.config
    log(f"SVE M={members}: decomposing (float64 SVD of every target)")
    sve = build_sve(base, members, TARGETS, None, SIGMA_INIT, args.seed)
    factorised: SVEModel = sve.model  # type: ignore[assignment]  # build_sve returns an SVEModel
    log(f"SVE M={members}: materialising")
    materialised = materialize(factorised)
    tokens = num_tokens(base, args.seq_len)
    report = parameter_report(base.model, factorised)
    closed = overhead_closed_form(
        int(config.num_hidden_layers),
        int(config.hidden_size),
        int(config.intermediate_size),
        len(base.labels),
        members,
    )
    check = torch_inputs(base, 1, args.seq_len, args.seed)
    factorised_config = Config(
        kind=FACTORISED,
        members=members,
        stored=stored_values(factorised),
        flops=sve_flops(base, factorised, tokens, materialised=False),
        graphs=[graph_for(factorised, base.input_kind)],
        paths=[tmp / f"sve-factorised-{members}.onnx"],
        report=report,
        closed_form=closed,
        target_overhead=target_overhead(factorised),
        paper_overhead=overhead_paper_fraction(int(config.hidden_size), members),
        member_gap=forms_gap(factorised, materialised, check),
    )
    # The same function and accounting; only the stored weights, FLOPs and graph differ.
    materialised_config = replace(
        factorised_config,
        kind=MATERIALISED,
        stored=stored_values(materialised),
        flops=sve_flops(base, factorised, tokens, materialised=True),
        graphs=[graph_for(materialised, base.input_kind)],
        paths=[tmp / f"sve-materialised-{members}.onnx"],
    )
    return [factorised_config, materialised_config]


def build_configs(
    shape: Shape, args: argparse.Namespace, tmp: Path
) -> tuple[LoadedModel, list[Config]]:
    """The dense model (it also makes the inputs) and the configurations: single, then per M
    the deep ensemble, SVE factorised and SVE materialised. Paths lie inside `tmp`."""
    from uqcompress.export.graph import graph_for

    log(f"{shape.name}: building the dense model")
    base = shape.build(args.seed)
    graph, path = graph_for(base.model, base.input_kind), tmp / "single.onnx"
    stored = base.num_parameters()
    flops = forward_flops(base, num_tokens(base, args.seq_len))
    configs = [Config(SINGLE, 1, stored, flops, [graph], [path])]
    for members in args.members:
        # The deep ensemble runs the dense model M times: M passes, M copies' weights.
        configs.append(
            Config(
                ENSEMBLE,
                members,
                members * stored,
                members * flops,
                [graph] * members,
                [path] * members,
            )
        )
        configs += sve_configs(base, members, args, tmp)
    return base, configs


# --------------------------------------------------------------------------- measuring


def exported_graphs(configs: Sequence[Config]) -> dict[Path, nn.Module]:
    """Each file to export once, with the graph it holds (deep ensembles reuse the single's)."""
    return {p: g for c in configs if c.exportable for g, p in zip(c.graphs, c.paths, strict=True)}


def time_torch(
    base: LoadedModel, configs: Sequence[Config], args: argparse.Namespace
) -> list[dict[int, float]]:
    """Per configuration, median torch seconds per batch size, all configurations interleaved."""
    import torch

    latency: list[dict[int, float]] = [{} for _ in configs]
    with torch.inference_mode():
        for batch in BATCHES:
            log(f"torch, batch {batch}, {len(configs)} configurations interleaved")
            inputs = torch_inputs(base, batch, args.seq_len, args.seed)
            runners = [torch_runner(c.graphs, inputs) for c in configs]
            medians = interleaved_medians(runners, args.warmup, args.repeats)
            for per_config, seconds in zip(latency, medians, strict=True):
                per_config[batch] = seconds
    return latency


def time_ort(
    base: LoadedModel, configs: Sequence[Config], args: argparse.Namespace
) -> tuple[list[dict[int, float] | None], list[float | None]]:
    """Per configuration, median ONNX Runtime seconds per batch size (the exported
    configurations interleaved) and the largest |member logits| difference to torch at batch 1;
    None for a configuration that was not exported. One session per file: a deep ensemble runs
    the single model's session M times."""
    graphs = exported_graphs(configs)
    sessions = {p: ort_session(p, args.threads) for p in graphs}
    check = ort_inputs(base, 1, args.seq_len, args.seed)
    path_gaps = {p: ort_torch_gap(g, sessions[p], check) for p, g in graphs.items()}
    timed = [c for c in configs if c.exportable]
    latency: dict[int, dict[int, float]] = {id(c): {} for c in timed}
    for batch in BATCHES:
        log(f"ONNX Runtime, batch {batch}, {len(timed)} configurations interleaved")
        inputs = ort_inputs(base, batch, args.seq_len, args.seed)
        runners = [ort_runner([sessions[p] for p in c.paths], inputs) for c in timed]
        medians = interleaved_medians(runners, args.warmup, args.repeats)
        for c, seconds in zip(timed, medians, strict=True):
            latency[id(c)][batch] = seconds
    return (
        [latency.get(id(c)) for c in configs],
        [max(path_gaps[p] for p in c.paths) if c.exportable else None for c in configs],
    )


def measure(shape: Shape, args: argparse.Namespace) -> list[CostRow]:
    """Every configuration: build, torch timing, export, file sizes, ONNX Runtime timing."""
    from uqcompress.export.onnx import export_graph

    with tempfile.TemporaryDirectory(prefix="sve_cost-") as tmp:
        base, configs = build_configs(shape, args, Path(tmp))
        torch_latency = time_torch(base, configs, args)
        for c in configs:
            if not c.exportable:
                log(f"not exporting {c.label}: {c.stored * FLOAT_BYTES / 1e9:.1f} GB of weights")
        for path, graph in exported_graphs(configs).items():
            log(f"exporting {path.name}")
            export_graph(graph, base, path, OPSET)
        sizes = [sum(p.stat().st_size for p in c.paths) if c.exportable else None for c in configs]
        ort_latency, gaps = time_ort(base, configs, args)
    return [
        CostRow(c, size, t, o, gap)
        for c, size, t, o, gap in zip(configs, sizes, torch_latency, ort_latency, gaps, strict=True)
    ]


# --------------------------------------------------------------------------- tables


def find(rows: Sequence[CostRow], kind: str, members: int) -> CostRow:
    return next(r for r in rows if r.config.kind == kind and r.config.members == members)


def millions(count: int | None) -> str:
    return "" if count is None else f"{count / 1e6:.2f}"


def percent(fraction: float | None) -> str:
    return "" if fraction is None else f"{fraction:.2%}"


def scientific(value: float | None) -> str:
    return "" if value is None else f"{value:.1e}"


def milliseconds(latency: dict[int, float] | None, batch: int) -> str:
    return "n/a" if latency is None else f"{latency[batch] * 1e3:.1f}"


def ratio(top: float | None, bottom: float | None) -> str:
    return "n/a" if top is None or bottom is None else f"{top / bottom:.2f}"


def latency_ratio(top: dict[int, float] | None, bottom: dict[int, float] | None, batch: int) -> str:
    return "n/a" if top is None or bottom is None else f"{top[batch] / bottom[batch]:.2f}"


def size_table(rows: Sequence[CostRow], shape: Shape) -> Table:
    """Values stored, SVE's parameter accounting and ONNX file sizes."""
    single = find(rows, SINGLE, 1)
    headers = ["configuration", "stored (M)", "x single", "trainable (M)", "extra (M)"]
    headers += ["closed form (M)", "extra / base", "extra / targets", "paper 5(M-1)/(4d)"]
    headers += ["ONNX (MB)", "x single"]
    body = []
    for row in rows:
        c, report = row.config, row.config.report
        mb = "n/a" if row.onnx_bytes is None else f"{row.onnx_bytes / 1e6:.0f}"
        body.append(
            [
                c.label,
                millions(c.stored),
                f"{c.stored / single.config.stored:.2f}",
                millions(report.trainable if report else None),
                millions(report.extra if report else None),
                millions(c.closed_form),
                percent(report.overhead if report else None),
                percent(c.target_overhead),
                percent(c.paper_overhead),
                mb,
                ratio(row.onnx_bytes, single.onnx_bytes),
            ]
        )
    title = (
        f"SVE sizes, {shape.name} shape. stored = parameters + float buffers (SVE: U and V "
        f"once; deep ensemble: M copies); trainable and extra from methods.sve.parameter_report, "
        f"extra = (M-1) x one member's own parameters, closed form = overhead_closed_form; "
        f"extra / base: over ALL base parameters, embeddings included; extra / targets: over "
        f"the target layers' weights only; ONNX = opset {OPSET} file(s), n/a: not exported "
        f"(2 GiB or more)"
    )
    return Table(title, headers, body)


def cost_table(rows: Sequence[CostRow], args: argparse.Namespace, shape: Shape) -> Table:
    """FLOPs, latencies and the parity columns."""
    headers = ["configuration", "GFLOPs/example"]
    headers += [f"torch b{b} (ms)" for b in BATCHES]
    headers += [f"ORT b{b} (ms)" for b in BATCHES]
    headers += ["factorised vs materialised", "ORT vs torch"]
    body = []
    for row in rows:
        cells = [row.config.label, f"{row.config.flops / 1e9:.2f}"]
        cells += [milliseconds(row.torch_latency, b) for b in BATCHES]
        cells += [milliseconds(row.ort_latency, b) for b in BATCHES]
        cells += [scientific(row.config.member_gap), scientific(row.ort_gap)]
        body.append(cells)
    title = (
        f"SVE cost, {shape.name} shape, sequence {args.seq_len}: torch eager and ONNX Runtime "
        f"on CPU, {args.threads} threads, median of {args.repeats} after {args.warmup} warm-up; "
        f"deep ensemble = the single model run M times; last two columns: max abs member-logit "
        f"difference at batch 1; n/a: not exported (2 GiB or more)"
    )
    return Table(title, headers, body)


def ratio_table(rows: Sequence[CostRow], args: argparse.Namespace) -> Table:
    """The deep ensemble and both SVE forms against single; SVE against the deep ensemble."""
    headers = ["M", "ratio", "stored", "ONNX", "FLOPs"]
    headers += [f"torch b{b}" for b in BATCHES]
    headers += [f"ORT b{b}" for b in BATCHES]
    single = find(rows, SINGLE, 1)
    body = []
    for members in args.members:
        ensemble = find(rows, ENSEMBLE, members)
        factorised = find(rows, FACTORISED, members)
        materialised = find(rows, MATERIALISED, members)
        pairs = [
            ("deep ensemble / single", ensemble, single),
            ("SVE factorised / single", factorised, single),
            ("SVE materialised / single", materialised, single),
            ("SVE factorised / deep ensemble", factorised, ensemble),
            ("SVE materialised / deep ensemble", materialised, ensemble),
            ("SVE factorised / materialised", factorised, materialised),
        ]
        for label, top, bottom in pairs:
            cells = [
                ratio(top.config.stored, bottom.config.stored),
                ratio(top.onnx_bytes, bottom.onnx_bytes),
                ratio(top.config.flops, bottom.config.flops),
            ]
            cells += [latency_ratio(top.torch_latency, bottom.torch_latency, b) for b in BATCHES]
            cells += [latency_ratio(top.ort_latency, bottom.ort_latency, b) for b in BATCHES]
            body.append([str(members), label, *cells])
    title = "Ratios, all from this run (latency: ms / ms at the same batch size)"
    return Table(title, headers, body, left=(1,))


# --------------------------------------------------------------------------- main


log = stderr_logger("sve_cost")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 layers, M 4")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown tables")
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch threads and ONNX Runtime intra-op threads (default: os.cpu_count())",
    )
    parser.add_argument("--repeats", type=int, help="timed runs per latency (default 10, quick 3)")
    parser.add_argument("--warmup", type=int, help="untimed runs first (default 2, quick 1)")
    parser.add_argument(
        "--members", type=int, nargs="+", help="ensemble sizes M (default 4 8, quick 4)"
    )
    parser.add_argument("--seq-len", type=int, default=128, help="BERT tokens (default 128)")
    parser.add_argument("--seed", type=int, default=0, help="weights, noise, inputs (default 0)")
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 3 if args.quick else 10
    if args.warmup is None:
        args.warmup = 1 if args.quick else 2
    if args.members is None:
        args.members = list(MEMBERS_QUICK if args.quick else MEMBERS_FULL)
    if min(args.members) < 2:
        parser.error("--members: an ensemble needs at least 2 members")
    return args


def bert_shape(quick: bool) -> Shape:
    """`prune_speed`'s BERT-base shape (30522-token vocabulary; quick: 2 layers)."""
    return next(s for s in pruning_shapes(quick) if s.family == "bert")


def machine_cpu_seconds() -> float | None:
    """CPU seconds every process (and the hypervisor's steal) used since boot: Linux's
    /proc/stat; None elsewhere."""
    stat = Path("/proc/stat")
    if not stat.exists():
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(
        int, stat.read_text().split("\n", 1)[0].split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def others_line(machine_start: float | None, own_start: float) -> str:
    """How much CPU other processes took during the run: with `--threads` equal to the core
    count, a busy neighbour slows torch down badly, so a reader should know."""
    machine_end = machine_cpu_seconds()
    if machine_start is None or machine_end is None:
        return "other processes' CPU use not measured (no /proc/stat)"
    others = max(0.0, machine_end - machine_start - (own_cpu_seconds() - own_start))
    return f"other processes used {others:.0f} CPU-s meanwhile"


def setup_line(args: argparse.Namespace, seconds: float, others: str) -> str:
    mode = "quick (2 layers of the BERT-base shape)" if args.quick else "full"
    return environment_line(mode, seconds, others)


def main() -> None:
    args = parse_args()

    import torch

    from uqcompress.models.loading import quiet_transformers

    quiet_transformers()
    torch.set_num_threads(args.threads)
    start, machine_start, own_start = time.perf_counter(), machine_cpu_seconds(), own_cpu_seconds()
    shape = bert_shape(args.quick)
    rows = measure(shape, args)
    others = others_line(machine_start, own_start)
    tables = [size_table(rows, shape), cost_table(rows, args, shape), ratio_table(rows, args)]
    setup = setup_line(args, time.perf_counter() - start, others)
    print_report(setup, tables, args.markdown)


if __name__ == "__main__":
    main()
