"""What does a Hydra ensemble cost on CPU next to one model and a deep ensemble? One run.

For four classifiers with random weights and the real shapes (those of `prune_speed.py`):
BERT-base (2 labels, sequence 128, bert-base-uncased's 30522-token vocabulary), RoBERTa-base
(2 labels, sequence 128, roberta-base's 50265-token vocabulary, a dense + tanh classification
head), ViT-B/16 (10 labels, 3x224x224, 197 tokens) and DINOv2-small (10 labels, 3x224x224,
patch 14, 257 tokens; 384 hidden, 6 heads, layer scale, classifier on [CLS ; mean of
patches]), and a decoder, Qwen2.5-0.5B (2 labels, sequence 128, 24 layers, hidden 896, 14
query heads over 2 key/value heads, SwiGLU 4864, its 151,936-token vocabulary; 32,000 in quick
mode), and for M = 2, 3 and 4 members, three ways to get predictions are measured side by
side (`--models` picks some of the five by name, comma-separated):

- single: one dense (unpruned) model, seed `--seed`;
- deep ensemble: that same dense model run M times, one pass after another. Only latency and
  memory are measured, and they do not depend on the weights' values: M different models would
  cost the same, as long as a layer's weights are out of the caches before the next pass needs
  them again (full mode: 300+ MB of weights per pass for the base models, about 90 MB for
  DINOv2-small; quick mode's 2 layers are about 55 MB for BERT-base, 15 MB for DINOv2-small,
  so a large L3 might keep some). One export instead of M keeps quick mode quick. Memory
  counts M copies resident (M sessions). Averaging the members' probabilities is not timed
  (negligible);
- Hydra: `methods.hydra.fuse` of M members pruned from the single model by a partition split,
  member m keeping heads h with h % M == m in every layer (12 heads: M = 2 -> 6 heads each,
  3 -> 4, 4 -> 3; DINOv2-small's 6 heads: M = 2 -> 3, 3 -> 2, 4 -> 2, 2, 1 and 1, the last two
  padded to 2 slots), run as one fused forward pass. With grouped-query attention (the
  decoder) members keep tiers of query heads instead (one query head of every key/value group
  per tier, `prune --unit query`), g // M tiers each of the g = 7 per group, sharing none (M =
  3: 4 of 14 heads), and keep both key/value heads; the Hydra row projects each member's own
  key/value heads once, and a row "Hydra, K/V per query slot" beside it is the layout before
  that (K/V columns copied for every query slot, `fuse(..., grouped_kv=False)`). A row
  "Hydra, batched member GEMMs" is the same Hydra exported with its member-wise maps (fused
  Q/K/V, attention output, pooler, classifier) as batched `[M, in, out]` MatMuls, the
  layout before one 2-D GEMM per member (`export_graph(..., member_gemms=False)`). With
  `--mlp-ratio r`, a row "Hydra, own MLPs": the same members with their MLPs cut to r of
  the neurons each (`uqc prune --mlp-ratio r`), each keeping its own MLP when fused.

Every configuration runs what `export.graph.graph_for` wraps around its model (member logits,
probabilities, entropy, mutual information), in torch and, exported at opset 18, in ONNX
Runtime. Per configuration:

1. torch eager CPU latency: median wall time of one batch under `torch.inference_mode`, over
   `--repeats` runs after `--warmup`, batch 1 and 8, `--threads` torch threads;
2. ONNX Runtime CPU latency: the same, CPUExecutionProvider with `--threads` intra-op threads.
   Within one engine and batch size, all configurations of a model take turns of 5 timed runs,
   so load spikes hit them alike; each turn starts with an untimed run (the first turn with the
   `--warmup` runs), so no configuration pays for the previous one's caches and thread pool;
3. peak memory: peak RSS growth of a fresh process that opens the configuration's ONNX Runtime
   session(s) (M of them for a deep ensemble, all resident) and runs one batch-8 forward through
   each, over its peak RSS after imports and loading the inputs. That is weights,
   session-creation transients (ONNX Runtime parses the file, then pre-packs weights) and
   activations, and no torch. The peak is the kernel's own high-water mark (VmHWM on Linux),
   so short peaks count too. Fresh processes because an allocator keeps freed memory and a
   high-water mark never comes down: in one process, each measurement would hide the next;
4. analytic FLOPs per example (below);
5. parameters (a deep ensemble: the sum over its members).

Ratios to the single model and Hydra / deep ensemble are taken from numbers of the same run.
Two parity columns guard against timing a wrong graph: for Hydra, the largest |member logit|
difference between the fused model and its members run one by one in torch (batch 1; about
1e-6 when fusion is right); for every configuration, the largest |member logit| difference
between ONNX Runtime and torch on that input.

FLOPs, counted as 2 x multiply-adds of the matrix products, per example with T tokens, hidden
size D, MLP size I, head size d, and s_l head slots per member in layer l (the largest member's
head count there: Hydra pads smaller members with zero heads, which are computed all the same;
with the partition split every member has exactly H / M heads when M divides H, so there is no
padding; DINOv2-small at M = 4 is padded). LayerNorm, softmax, GELU, layer scale, biases,
residual adds and DINOv2's mean over patches are elementwise and left out. As in
`prune_speed.py`, one formula serves every family: D and I from `family.sizes(config)`, T the
sequence length for text and `family.fixed_tokens(config)` for images (N patches plus the
special tokens), the head from `family.layout`:

    per layer l:  M [2 T D (s_l d)        Q and O projections of every member
                     + 2 T D (k_l d)      K and V: k_l key/value slots (k_l = s_l without
                                          grouped-query attention)
                     + 2 s_l T^2 d]       scores Q K^T and the attention-weighted sum of V
                + M 2 T D I               the shared MLP, run on each member's stream
                                          (3 T D I for a gated SwiGLU MLP)
    embeddings:   once; 0 for text (table lookups), images: patch projection N (C P^2) D
    head:         per member; pooler D^2 where `layout.pooler_activation` is set (BERT's
                  pooler, RoBERTa's classification-head dense), then classifier (w D) C_out,
                  w = `layout.pooled_width` (1: the first token; 2: DINOv2's [CLS ; mean])
    FLOPs = 2 x (sum over layers + embeddings + heads)

Single is M = 1 with all H heads (the formula of `prune_speed.py`), a deep ensemble M x single.
The Hydra paper's notes estimate Hydra at about 2.3x single and 0.78x a deep
ensemble for ViT-B with M = 3, counting per token and leaving out the T^2 terms, embeddings and
classifiers; a note under the tables sets this run's numbers next to that estimate.

`--quick` is a smoke run (about 6 minutes for the four models on 2 cores, one of them shared
with another process): 2 layers of each shape (per-layer ratios are the real ones, embeddings
and classifiers weigh more), M = 2 and 3, 3 repeats after 1 warm-up. Full mode is the same
code at 12 layers, M up to 4 and 10 repeats after 2 warm-ups: roughly half an hour on 2 cores
for BERT-base and ViT-B/16 together, extrapolated from quick mode; RoBERTa-base costs about
what BERT-base does, DINOv2-small much less (`--models` and `--members` shorten a run).
Timings depend on the machine and what else runs on it (torch with `--threads` equal to the
core count slows down badly when another process takes a core); nothing here asserts on them.

    .venv/bin/python benchmarks/hydra_cost.py [--quick] [--markdown] [--threads 2]
        [--models RoBERTa-base,DINOv2-small] [--members 3]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

# Run as a script, this file's folder is on sys.path: the sibling benchmark imports as a module.
from prune_speed import (
    BATCHES,
    OPSET,
    TURN_RUNS,
    Shape,
    Table,
    embedding_macs,
    environment_line,
    head_macs,
    layer_macs,
    model_names,
    num_tokens,
    ort_inputs,
    ort_session,
    print_report,
    pruning_shapes,
    stderr_logger,
    tokens_line,
)

if TYPE_CHECKING:
    from torch import nn

    from uqcompress.models.loading import LoadedModel

MEMBERS_FULL = (2, 3, 4)
MEMBERS_QUICK = (2, 3)
MEMORY_BATCH = max(BATCHES)
NOTE_SHAPE, NOTE_MEMBERS = "ViT-B/16", 3  # the case the paper's notes estimate
NOTE_VS_SINGLE, NOTE_VS_ENSEMBLE = 2.3, 0.78
SINGLE, ENSEMBLE, HYDRA = "single", "deep ensemble", "Hydra"
PER_QUERY = "Hydra, K/V per query slot"  # GQA rows: the layout before grouped K/V
BATCHED = "Hydra, batched member GEMMs"  # the ONNX layout before one 2-D GEMM per member
OWN_MLPS = "Hydra, own MLPs"  # --mlp-ratio: members narrowed as `uqc prune --mlp-ratio` does


@dataclass
class CostRow:
    """One configuration of one model; latencies in seconds per batch size, memory in bytes."""

    model: str
    kind: str  # SINGLE, ENSEMBLE or HYDRA
    members: int
    heads: int  # heads per member per layer
    params: int
    flops: int
    torch_latency: dict[int, float]
    ort_latency: dict[int, float]
    peak_rss: int
    ort_gap: float  # max |member logits| ONNX Runtime vs torch, batch 1
    fusion_gap: float | None = None  # Hydra: max |member logits| fused vs members alone
    tokens: int = 0  # per example


@dataclass
class Config:
    """What one row runs: `graphs` one after another, exported to the files `paths`."""

    kind: str
    members: int
    heads: int
    params: int
    flops: int
    graphs: list[nn.Module]
    paths: list[Path]
    fusion_gap: float | None = None
    member_gemms: bool = True  # export_graph's layout of the member-wise maps


# --------------------------------------------------------------------------- models


def partition_keep(heads: int, layers: int, members: int, member: int) -> list[list[int]]:
    """Heads member `member` keeps in every layer: those with index % members == member."""
    return [[h for h in range(heads) if h % members == member] for _ in range(layers)]


def member_keeps(base: LoadedModel, members: int) -> list[list[list[int]]]:
    """What each member keeps: `partition_keep` without grouped-query attention; with it,
    tiers of query heads (one query head of every key/value group per tier, `prune --unit
    query`), dealt so that no two members share a head: g // M tiers each of the g per group
    (Qwen2.5-0.5B, g = 7, M = 3: 2 tiers, 4 of 14 heads)."""
    from uqcompress.methods.pruning import select_grouped_member_heads
    from uqcompress.methods.scoring import random_scores
    from uqcompress.models.head_gates import head_groups

    heads = int(base.config.num_attention_heads)
    layers = int(base.config.num_hidden_layers)
    groups = head_groups(base)
    kv = groups.kv_heads[0]
    if kv == heads:
        return [partition_keep(heads, layers, members, m) for m in range(members)]
    tiers = heads // kv // members
    if tiers == 0:
        raise SystemExit(f"M={members} is more members than the {heads // kv} tiers per group")
    scores = random_scores(len(groups.heads), groups.heads[0], seed=0)
    return select_grouped_member_heads(scores, groups, members, tiers * kv, "partition")


def torch_inputs(loaded: LoadedModel, batch: int, seq_len: int, seed: int) -> dict[str, Any]:
    """`ort_inputs` as torch tensors (the same values)."""
    import torch

    return {k: torch.from_numpy(v) for k, v in ort_inputs(loaded, batch, seq_len, seed).items()}


def build_hydra(
    base: LoadedModel,
    members: int,
    check: dict[str, Any],
    grouped_kv: bool = True,
    mlp_ratio: float = 1.0,
) -> tuple[LoadedModel, float]:
    """The Hydra model of `members` partition-pruned copies of `base` (`member_keeps`), and
    the largest |member logit| difference between it and the members run one by one on
    `check`. `grouped_kv=False`: the per-query K/V layout (`methods.hydra.fuse`);
    `mlp_ratio` < 1: each member's MLP keeps that share of the neurons, as `uqc prune
    --mlp-ratio` cuts them, and keeps it as its own in the fused model."""
    import torch

    from uqcompress.methods.hydra import fuse
    from uqcompress.methods.mlp_width import member_mlp_neurons
    from uqcompress.models.outputs import member_logits
    from uqcompress.models.surgery import narrow_mlp, prune_heads

    neurons = member_mlp_neurons(base, members, mlp_ratio) if mlp_ratio < 1.0 else None
    parts = []
    for m, keep in enumerate(member_keeps(base, members)):
        part = copy.deepcopy(base)
        prune_heads(part, keep)
        if neurons is not None:
            narrow_mlp(part, neurons[m])
        parts.append(part)
    hydra = fuse(parts, grouped_kv=grouped_kv)
    with torch.inference_mode():
        fused = member_logits(hydra.model, check)  # [B, M, C]
        alone = torch.stack([p.model(**check).logits for p in parts], dim=1)
    return hydra, float((fused - alone).abs().max())


def decoder_shapes(quick: bool) -> list[Shape]:
    """The decoder rows: a Qwen2.5-0.5B-shaped classifier (24 layers, hidden 896, 14 query
    heads over 2 key/value heads, SwiGLU 4864; its 151,936-token vocabulary, 32,000 in quick
    mode, where 2 layers make the embeddings weigh more than they should)."""
    layers = {"num_hidden_layers": 2, "vocab_size": 32000} if quick else {}
    return [Shape("Qwen2.5-0.5B", "qwen2", 2, "base", layers)]


# --------------------------------------------------------------------------- FLOPs


def ensemble_flops(
    loaded: LoadedModel,
    tokens: int,
    members: int,
    slots: Sequence[int],
    kv_slots: Sequence[int] | None = None,
) -> int:
    """FLOPs of one example's forward pass (formula in the module docstring).

    `slots[l]` is the number of (query) head slots each of the `members` streams computes in
    layer l, `kv_slots[l]` its key/value head slots (grouped-query attention; default the
    same). Every stream runs a block of those heads and the shared MLP
    (`prune_speed.layer_macs`) and its own head; the embeddings run once.
    """
    kv = slots if kv_slots is None else kv_slots
    macs = members * sum(
        layer_macs(loaded, tokens, heads, kv_heads)
        for heads, kv_heads in zip(slots, kv, strict=True)
    )
    macs += embedding_macs(loaded) + members * head_macs(loaded)
    return 2 * macs


# --------------------------------------------------------------------------- timing


def interleaved_medians(
    runners: Sequence[Callable[[], object]], warmup: int, repeats: int
) -> list[float]:
    """Median wall seconds of one call, per runner.

    As `prune_speed.median_latencies`, for any callables: the runners take turns of TURN_RUNS
    timed calls, each turn after one untimed call (so a runner never pays for the previous
    one's caches and thread pool); a runner's first turn starts with `warmup` untimed calls
    instead (at least one), which saves a forward pass per runner over warming up apart.
    """
    times: list[list[float]] = [[] for _ in runners]
    while len(times[0]) < repeats:
        turn = min(TURN_RUNS, repeats - len(times[0]))
        for run, samples in zip(runners, times, strict=True):
            for _ in range(max(warmup, 1) if not samples else 1):
                run()
            for _ in range(turn):
                start = time.perf_counter()
                run()
                samples.append(time.perf_counter() - start)
    return [statistics.median(samples) for samples in times]


def torch_runner(graphs: Sequence[nn.Module], inputs: dict[str, Any]) -> Callable[[], object]:
    """One forward pass through each graph, one after another."""
    return lambda: [graph(**inputs) for graph in graphs]


def ort_runner(sessions: Sequence[Any], inputs: dict[str, np.ndarray]) -> Callable[[], object]:
    return lambda: [session.run(None, inputs) for session in sessions]


def ort_torch_gap(graph: nn.Module, session: Any, inputs: dict[str, np.ndarray]) -> float:
    """Largest |member logits| difference between ONNX Runtime and torch on the same inputs."""
    import torch

    with torch.inference_mode():
        reference = graph(**{k: torch.from_numpy(v) for k, v in inputs.items()})[0]
    logits = session.run(["member_logits"], inputs)[0]
    return float(np.max(np.abs(reference.numpy() - logits)))


# --------------------------------------------------------------------------- memory


def rss_high_water() -> int:
    """This process's peak resident set size so far, in bytes.

    Linux: VmHWM of /proc/self/status, which starts afresh at exec. Not `ru_maxrss`: there a
    child inherits its parent's high-water mark, so a probe started by a big parent reads 0.
    Elsewhere `ru_maxrss` (bytes on macOS), the best there is.
    """
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def memory_probe(inputs_path: Path, model_paths: Sequence[Path], threads: int) -> None:
    """In a fresh process: print the peak RSS growth, in bytes, of opening every model's
    session and running each once on the saved inputs (what the module docstring describes)."""
    import onnxruntime  # noqa: F401  (imported before the baseline, like numpy)

    with np.load(inputs_path) as saved:
        inputs = {name: saved[name] for name in saved.files}
    baseline = rss_high_water()
    sessions = [ort_session(path, threads) for path in model_paths]
    for session in sessions:
        session.run(None, inputs)
    print(json.dumps({"peak_rss_growth": rss_high_water() - baseline}))


def peak_rss(inputs_path: Path, model_paths: Sequence[Path], threads: int) -> int:
    """Run `memory_probe` in a fresh interpreter and return its answer."""
    command = [sys.executable, __file__, "--probe-inputs", str(inputs_path), "--threads"]
    command += [str(threads), "--probe-models", *map(str, model_paths)]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"memory probe failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return int(json.loads(proc.stdout.splitlines()[-1])["peak_rss_growth"])


# --------------------------------------------------------------------------- one model


def build_configs(
    shape: Shape, args: argparse.Namespace, tmp: Path
) -> tuple[LoadedModel, list[Config]]:
    """The dense model (it also makes the inputs) and the configurations: single, then per M
    the deep ensemble and Hydra. Paths are where each graph will be exported, inside `tmp`."""
    from uqcompress.export.graph import graph_for
    from uqcompress.models.head_gates import heads_per_layer
    from uqcompress.models.hydra_model import HydraSpec

    log(f"{shape.name}: building the dense model")
    dense = shape.build(args.seed)
    tokens = num_tokens(dense, args.seq_len)
    heads = int(dense.config.num_attention_heads)
    graph, path = graph_for(dense.model, dense.input_kind), tmp / "dense.onnx"
    kv_heads = int(getattr(dense.config, "num_key_value_heads", None) or heads)
    per_layer = heads_per_layer(dense)
    flops = ensemble_flops(dense, tokens, 1, per_layer, [kv_heads] * len(per_layer))
    params = dense.num_parameters()
    configs = [Config(SINGLE, 1, heads, params, flops, [graph], [path])]
    check = torch_inputs(dense, 1, args.seq_len, args.seed)
    for members in args.members:
        # The deep ensemble runs the dense model M times: M passes, M copies' weights.
        ensemble = Config(
            ENSEMBLE,
            members,
            heads,
            members * params,
            members * flops,
            [graph] * members,
            [path] * members,
        )
        configs.append(ensemble)
        layouts = [(HYDRA, True, True, 1.0), (BATCHED, True, False, 1.0)]
        if kv_heads < heads:
            layouts.append((PER_QUERY, False, True, 1.0))
        if args.mlp_ratio is not None and dense.family.mlp_width_key is not None:
            layouts.append((OWN_MLPS, True, True, args.mlp_ratio))  # (not DINOv2: refused)
        for kind, grouped, member_gemms, ratio in layouts:
            log(f"{shape.name}: fusing {kind} M={members}")
            hydra, gap = build_hydra(dense, members, check, grouped, ratio)
            spec = HydraSpec.from_config(hydra.config)
            slots = [spec.slots(layer) for layer in range(spec.layers)]
            kv_slots = [spec.kv_slots(layer) for layer in range(spec.layers)]
            suffix = ("" if grouped else "-per-query") + ("" if member_gemms else "-batched")
            suffix += "" if ratio == 1.0 else "-own-mlps"
            configs.append(
                Config(
                    kind,
                    members,
                    max(slots),
                    hydra.num_parameters(),
                    ensemble_flops(hydra, tokens, members, slots, kv_slots),
                    [graph_for(hydra.model, hydra.input_kind)],
                    [tmp / f"hydra-{members}{suffix}.onnx"],
                    fusion_gap=gap,
                    member_gemms=member_gemms,
                )
            )
    return dense, configs


def exported_graphs(configs: Sequence[Config]) -> dict[Path, nn.Module]:
    """Each file once, with the graph it holds (deep ensembles reuse the dense model's)."""
    return {p: g for c in configs for g, p in zip(c.graphs, c.paths, strict=True)}


def batched_paths(configs: Sequence[Config]) -> set[Path]:
    """The files exported with batched `[M, in, out]` member GEMMs (`BATCHED` rows)."""
    return {p for c in configs if not c.member_gemms for p in c.paths}


def time_torch(
    name: str, dense: LoadedModel, configs: Sequence[Config], args: argparse.Namespace
) -> list[dict[int, float]]:
    """Per configuration, median torch seconds per batch size, all configurations interleaved."""
    import torch

    latency: list[dict[int, float]] = [{} for _ in configs]
    with torch.inference_mode():
        for batch in BATCHES:
            log(f"{name}: torch, batch {batch}, {len(configs)} configurations interleaved")
            inputs = torch_inputs(dense, batch, args.seq_len, args.seed)
            runners = [torch_runner(c.graphs, inputs) for c in configs]
            medians = interleaved_medians(runners, args.warmup, args.repeats)
            for per_config, seconds in zip(latency, medians, strict=True):
                per_config[batch] = seconds
    return latency


def time_ort(
    name: str, dense: LoadedModel, configs: Sequence[Config], args: argparse.Namespace
) -> tuple[list[dict[int, float]], list[float]]:
    """Per configuration, median ONNX Runtime seconds per batch size (all configurations
    interleaved) and the largest |member logits| difference to torch at batch 1.

    One session per file: a deep ensemble runs the dense model's session M times.
    """
    graphs = exported_graphs(configs)
    sessions = {p: ort_session(p, args.threads) for p in graphs}
    check = ort_inputs(dense, 1, args.seq_len, args.seed)
    path_gaps = {p: ort_torch_gap(g, sessions[p], check) for p, g in graphs.items()}
    gaps = [max(path_gaps[p] for p in c.paths) for c in configs]
    latency: list[dict[int, float]] = [{} for _ in configs]
    for batch in BATCHES:
        log(f"{name}: ONNX Runtime, batch {batch}, {len(configs)} configurations interleaved")
        inputs = ort_inputs(dense, batch, args.seq_len, args.seed)
        runners = [ort_runner([sessions[p] for p in c.paths], inputs) for c in configs]
        medians = interleaved_medians(runners, args.warmup, args.repeats)
        for per_config, seconds in zip(latency, medians, strict=True):
            per_config[batch] = seconds
    return latency, gaps


def measure_model(shape: Shape, args: argparse.Namespace) -> list[CostRow]:
    """All configurations of one shape: torch timing, export, ONNX Runtime timing, memory."""
    from uqcompress.export.onnx import export_graph

    with tempfile.TemporaryDirectory(prefix="hydra_cost-") as tmp:
        dense, configs = build_configs(shape, args, Path(tmp))
        torch_latency = time_torch(shape.name, dense, configs, args)
        batched = batched_paths(configs)
        for path, graph in exported_graphs(configs).items():
            log(f"{shape.name}: exporting {path.name}")
            export_graph(graph, dense, path, OPSET, member_gemms=path not in batched)
        ort_latency, gaps = time_ort(shape.name, dense, configs, args)
        inputs_path = Path(tmp) / "inputs.npz"
        arrays: dict[str, Any] = ort_inputs(dense, MEMORY_BATCH, args.seq_len, args.seed)
        np.savez(inputs_path, **arrays)  # Any: numpy's stub reads ** as allow_pickle too
        peaks = []
        for c in configs:
            log(f"{shape.name}: peak memory of {c.kind} M={c.members} (fresh process)")
            peaks.append(peak_rss(inputs_path, c.paths, args.threads))
    return [
        CostRow(
            model=shape.name,
            kind=c.kind,
            members=c.members,
            heads=c.heads,
            params=c.params,
            flops=c.flops,
            torch_latency=t,
            ort_latency=o,
            peak_rss=peak,
            ort_gap=gap,
            fusion_gap=c.fusion_gap,
            tokens=num_tokens(dense, args.seq_len),
        )
        for c, t, o, peak, gap in zip(configs, torch_latency, ort_latency, peaks, gaps, strict=True)
    ]


# --------------------------------------------------------------------------- tables


def find(rows: Sequence[CostRow], model: str, kind: str, members: int) -> CostRow:
    return next(r for r in rows if r.model == model and r.kind == kind and r.members == members)


def cost_table(rows: Sequence[CostRow], args: argparse.Namespace) -> Table:
    headers = ["model", "configuration", "heads", "params (M)", "GFLOPs/example"]
    headers += [f"torch b{b} (ms)" for b in BATCHES]
    headers += [f"ORT b{b} (ms)" for b in BATCHES]
    headers += [f"peak RSS b{MEMORY_BATCH} (MiB)", "fused vs members", "ORT vs torch"]
    body = []
    for row in rows:
        name = row.kind if row.kind == SINGLE else f"{row.kind} M={row.members}"
        cells = [
            row.model,
            name,
            str(row.heads),
            f"{row.params / 1e6:.1f}",
            f"{row.flops / 1e9:.2f}",
        ]
        cells += [f"{row.torch_latency[b] * 1e3:.1f}" for b in BATCHES]
        cells += [f"{row.ort_latency[b] * 1e3:.1f}" for b in BATCHES]
        cells.append(f"{row.peak_rss / 2**20:.0f}")
        cells.append("" if row.fusion_gap is None else f"{row.fusion_gap:.1e}")
        cells.append(f"{row.ort_gap:.1e}")
        body.append(cells)
    title = (
        f"Hydra cost: torch eager and ONNX Runtime on CPU, {args.threads} threads, median of "
        f"{args.repeats} after {args.warmup} warm-up; tokens per example: {tokens_line(rows)}. "
        f"heads = per member per layer; deep ensemble = the dense model run M "
        f"times; peak RSS = growth of a fresh ONNX Runtime process "
        f"opening all its sessions and running one batch-{MEMORY_BATCH} forward (weights "
        f"included); last two columns: max abs member-logit difference"
    )
    return Table(title, headers, body, left=(0, 1))


def ratio_table(rows: Sequence[CostRow], args: argparse.Namespace) -> Table:
    headers = ["model", "M", "ratio", "params", "FLOPs"]
    headers += [f"torch b{b}" for b in BATCHES]
    headers += [f"ORT b{b}" for b in BATCHES]
    headers.append("peak RSS")
    body = []
    for model in dict.fromkeys(r.model for r in rows):
        single = find(rows, model, SINGLE, 1)
        for members in args.members:
            ensemble = find(rows, model, ENSEMBLE, members)
            hydra = find(rows, model, HYDRA, members)
            pairs = [
                ("deep ensemble / single", ensemble, single),
                ("Hydra / single", hydra, single),
                ("Hydra / deep ensemble", hydra, ensemble),
            ]
            per_query = [
                r for r in rows if (r.model, r.kind, r.members) == (model, PER_QUERY, members)
            ]
            if per_query:  # grouped-query attention: the older layout beside the grouped one
                pairs.append(("K/V per query slot / deep ensemble", per_query[0], ensemble))
                pairs.append(("Hydra / K/V per query slot", hydra, per_query[0]))
            batched = [r for r in rows if (r.model, r.kind, r.members) == (model, BATCHED, members)]
            if batched:  # the ONNX layout before one 2-D GEMM per member
                pairs.append(("batched member GEMMs / deep ensemble", batched[0], ensemble))
                pairs.append(("Hydra / batched member GEMMs", hydra, batched[0]))
            own = [r for r in rows if (r.model, r.kind, r.members) == (model, OWN_MLPS, members)]
            if own:  # --mlp-ratio: members with MLP neurons of their own
                r = args.mlp_ratio
                pairs.append((f"own MLPs r={r:g} / single", own[0], single))
                pairs.append((f"own MLPs r={r:g} / deep ensemble", own[0], ensemble))
            for label, top, bottom in pairs:
                values = [top.params / bottom.params, top.flops / bottom.flops]
                values += [top.torch_latency[b] / bottom.torch_latency[b] for b in BATCHES]
                values += [top.ort_latency[b] / bottom.ort_latency[b] for b in BATCHES]
                values.append(top.peak_rss / bottom.peak_rss)
                body.append([model, str(members), label, *(f"{v:.2f}" for v in values)])
    title = "Ratios, all from this run (latency: ms / ms at the same batch size)"
    return Table(title, headers, body, left=(0, 2))


def estimate_note(rows: Sequence[CostRow]) -> str:
    """This run's ViT-B M=3 Hydra numbers next to the paper notes' FLOPs estimate."""
    try:
        single = find(rows, NOTE_SHAPE, SINGLE, 1)
        ensemble = find(rows, NOTE_SHAPE, ENSEMBLE, NOTE_MEMBERS)
        hydra = find(rows, NOTE_SHAPE, HYDRA, NOTE_MEMBERS)
    except StopIteration:
        return f"(No {NOTE_SHAPE} M={NOTE_MEMBERS} row to set against the paper notes' estimate.)"

    def ratios(top: CostRow, bottom: CostRow) -> str:
        b = max(BATCHES)
        return (
            f"FLOPs {top.flops / bottom.flops:.2f}x, torch b{b} "
            f"{top.torch_latency[b] / bottom.torch_latency[b]:.2f}x, ORT b{b} "
            f"{top.ort_latency[b] / bottom.ort_latency[b]:.2f}x"
        )

    return (
        f"The paper notes estimate {NOTE_SHAPE} Hydra M={NOTE_MEMBERS} at about "
        f"{NOTE_VS_SINGLE}x single and {NOTE_VS_ENSEMBLE}x a deep ensemble in FLOPs (per token, "
        f"T^2 terms left out). This run: vs single {ratios(hydra, single)}; vs deep ensemble "
        f"{ratios(hydra, ensemble)}."
    )


# --------------------------------------------------------------------------- main


log = stderr_logger("hydra_cost")


MAX_THREADS = 64


def default_threads() -> int:
    """Every core, up to MAX_THREADS: a bigger machine's default is not refused."""
    return min(os.cpu_count() or 1, MAX_THREADS)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 layers, M 2 and 3")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown tables")
    parser.add_argument(
        "--threads",
        type=int,
        default=default_threads(),
        help=f"torch threads and ONNX Runtime intra-op threads (default: the cores, at most "
        f"{MAX_THREADS})",
    )
    parser.add_argument("--repeats", type=int, help="timed runs per latency (default 10, quick 3)")
    parser.add_argument("--warmup", type=int, help="untimed runs first (default 2, quick 1)")
    parser.add_argument(
        "--members", type=int, nargs="+", help="ensemble sizes M (default 2 3 4, quick 2 3)"
    )
    parser.add_argument(
        "--seq-len", type=int, default=128, help="text models' tokens (default 128)"
    )
    parser.add_argument("--seed", type=int, default=0, help="weights and inputs (default 0)")
    parser.add_argument(
        "--mlp-ratio",
        type=float,
        help="also a Hydra of members whose MLPs keep this share of the neurons each "
        "(uqc prune --mlp-ratio), in (0, 1)",
    )
    parser.add_argument(
        "--models",
        type=model_names,
        help="comma-separated models (default all: BERT-base,RoBERTa-base,ViT-B/16,"
        "DINOv2-small,Qwen2.5-0.5B)",
    )
    # Internal: one peak-memory measurement in a fresh process (see `memory_probe`).
    parser.add_argument("--probe-inputs", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--probe-models", type=Path, nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 3 if args.quick else 10
    if args.warmup is None:
        args.warmup = 1 if args.quick else 2
    if args.members is None:
        args.members = list(MEMBERS_QUICK if args.quick else MEMBERS_FULL)
    # every count bounded before anything is built (as benchmarks/hydra_trunk.py)
    if not all(2 <= m <= 8 for m in args.members) or not 1 <= args.threads <= MAX_THREADS:
        raise SystemExit(f"--members must be 2..8 and --threads 1..{MAX_THREADS}")
    if not 1 <= args.repeats <= 1000 or not 0 <= args.warmup <= 100:
        raise SystemExit("--repeats must be 1..1000 and --warmup 0..100")
    if not 1 <= args.seq_len <= 512:
        raise SystemExit("--seq-len must be 1..512 (the text shapes' position tables)")
    if args.mlp_ratio is not None and not 0 < args.mlp_ratio < 1:
        raise SystemExit("--mlp-ratio must be in (0, 1): 1 is the Hydra row itself")
    return args


def setup_line(args: argparse.Namespace, seconds: float) -> str:
    mode = "quick (2 layers of each shape)" if args.quick else "full"
    return environment_line(mode, seconds)


def main() -> None:
    args = parse_args()
    if args.probe_inputs is not None:
        memory_probe(args.probe_inputs, args.probe_models, args.threads)
        return

    import torch

    from uqcompress.models.loading import quiet_transformers

    quiet_transformers()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    shapes = pruning_shapes(args.quick, args.models, decoder_shapes(args.quick))
    rows = [row for shape in shapes for row in measure_model(shape, args)]
    tables = [cost_table(rows, args), ratio_table(rows, args)]
    note = estimate_note(rows)
    setup = setup_line(args, time.perf_counter() - start)
    print_report(setup, tables, args.markdown, note)


if __name__ == "__main__":
    main()
