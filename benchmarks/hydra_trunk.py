"""What does a shared trunk (`uqc fuse --shared-layers K`) buy a Hydra ensemble on CPU? One run.

For each shape of `hydra_cost.py` asked for (`--models`, default BERT-base; also MiniLM-L6,
the shape of `real_text.py`'s checkpoint, where the trunk's quality is measured; random
weights, the real shapes), M members partition-pruned from the dense model (member m keeps heads
h % M == m in every layer, as `hydra_cost.py`), side by side in ONNX Runtime (CPU, opset
18, what `export.graph.graph_for` wraps: member logits, probabilities, entropy, mutual
information):

- single: the dense model; deep ensemble: it run M times, one pass after another;
- Hydra with K = 0 (the paper's), L/4, L/2 and 3L/4 shared blocks (`--shared` overrides):
  the first K blocks run once with every head some member kept (with the partition split:
  all H heads, the dense model's own block), the members branch after them;
- with `--mlp-ratios`, Hydra (K = 0) of members that keep r of the MLP neurons each
  (`uqc prune --mlp-ratio r`): each member runs its own narrower MLP.

Per configuration: median ONNX Runtime latency per batch (batch 1 and 8, all configurations
of a batch size interleaved in turns, `hydra_cost.interleaved_medians`), its ratio to the
single model and to the deep ensemble (fp32 both, also for `--int8`'s rows: every
configuration dynamically int8-quantized as `uqc quantize` does), and the analytic FLOPs
per example (the formula of `hydra_cost.py`, with a trunk layer counted once over its
heads) with the same ratios. A
parity column guards against timing a wrong graph: the largest |member logit| difference
between the fused model and its reference (`methods.hydra.shared_weight_members`: each member
with the trunk's blocks, run alone in torch), and between ONNX Runtime and torch.

What the trunk does to uncertainty (OOD AUROC, ECE, disagreement) needs trained members on
real data: `benchmarks/real_text.py` is where to measure it; random weights say nothing there.

    .venv/bin/python benchmarks/hydra_trunk.py [--quick] [--members 3] [--markdown]
        [--models BERT-base,MiniLM-L6,ViT-B/16] [--shared 0,3,6,9] [--threads 2] [--int8]
        [--mlp-ratios 0.5,0.667]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hydra_cost import (
    MAX_THREADS,
    default_threads,
    interleaved_medians,
    ort_runner,
    partition_keep,
    torch_inputs,
)
from prune_speed import (
    BATCHES,
    BERT_VOCAB,
    OPSET,
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
)

log = stderr_logger("hydra_trunk")
MAX_SEQ_LEN = 512  # BERT-base's and MiniLM's position tables


def minilm_shape(quick: bool) -> Shape:
    """all-MiniLM-L6-v2's shape (BERT: 6 layers x 12 heads of 32, hidden 384, MLP 1536), the
    checkpoint `real_text.py` measures the trunk's quality on, with its 5 BBC topics."""
    layers = 2 if quick else 6
    return Shape(
        "MiniLM-L6",
        "bert",
        5,
        "base",
        {
            "vocab_size": BERT_VOCAB,
            "hidden_size": 384,
            "intermediate_size": 1536,
            "num_hidden_layers": layers,
        },
    )


def trunk_flops(loaded: Any, tokens: int, members: int, spec: Any) -> int:
    """FLOPs of one example: a trunk layer once over its heads, a member layer M times over
    its slots, the embeddings once and M heads (hydra_cost.py's formula otherwise)."""
    macs = 0
    for layer in range(spec.layers):
        streams = 1 if spec.shared(layer) else members
        macs += streams * layer_macs(loaded, tokens, spec.slots(layer))
    macs += embedding_macs(loaded) + members * head_macs(loaded)
    return 2 * macs


def narrowed(members: list[Any], dense: Any, ratio: float) -> list[Any]:
    """Copies of `members` whose MLPs keep `ratio` of the neurons each, as `uqc prune
    --mlp-ratio` cuts them (ranked on the dense model, dealt round-robin)."""
    from uqcompress.methods.mlp_width import member_mlp_neurons
    from uqcompress.models.surgery import narrow_mlp

    neurons = member_mlp_neurons(dense, len(members), ratio)
    copies = []
    for member, kept in zip(members, neurons, strict=True):
        part = copy.deepcopy(member)
        narrow_mlp(part, kept)
        copies.append(part)
    return copies


def measure(shape: Any, args: argparse.Namespace) -> list[list[str]]:
    import numpy as np
    import torch

    from uqcompress.export.graph import graph_for
    from uqcompress.export.onnx import export_graph
    from uqcompress.export.quantize import quantize_graph
    from uqcompress.methods.hydra import fuse, shared_weight_members
    from uqcompress.models.head_gates import heads_per_layer
    from uqcompress.models.outputs import member_logits
    from uqcompress.models.surgery import prune_heads

    log(f"{shape.name}: building the dense model")
    dense = shape.build(args.seed)
    tokens = num_tokens(dense, args.seq_len)
    heads = int(dense.config.num_attention_heads)
    layers = int(dense.config.num_hidden_layers)
    m = args.members
    shared = args.shared or sorted({0, layers // 4, layers // 2, (3 * layers) // 4})
    shared = [k for k in shared if 0 <= k < layers]
    single_flops = 2 * (
        sum(layer_macs(dense, tokens, h) for h in heads_per_layer(dense))
        + embedding_macs(dense)
        + head_macs(dense)
    )
    members = []
    for member in range(m):
        part = copy.deepcopy(dense)
        prune_heads(part, partition_keep(heads, layers, m, member))
        members.append(part)
    check = torch_inputs(dense, 1, args.seq_len, args.seed)
    with tempfile.TemporaryDirectory(prefix="hydra_trunk-") as tmp:
        paths: dict[str, Path] = {"single": Path(tmp) / "single.onnx"}
        graphs: dict[str, Any] = {"single": graph_for(dense.model, dense.input_kind)}
        flops = {"single": single_flops, "deep ensemble": m * single_flops}
        gaps: dict[str, str] = {"single": "-", "deep ensemble": "-"}
        fusions = [(f"Hydra K={k}", members, k) for k in shared]
        fusions += [(f"Hydra r={r:g}", narrowed(members, dense, r), 0) for r in args.mlp_ratios]
        for name, fused_members, k in fusions:
            log(f"{shape.name}: fusing {name}")
            hydra = fuse(fused_members, shared_layers=k)
            with torch.inference_mode():
                fused = member_logits(hydra.model, check)
                reference = shared_weight_members(fused_members, shared_layers=k)
                alone = torch.stack([r.model(**check).logits for r in reference], dim=1)
            gaps[name] = f"{float((fused - alone).abs().max()):.1e}"
            graphs[name] = graph_for(hydra.model, hydra.input_kind)
            paths[name] = Path(tmp) / f"hydra-{len(paths)}.onnx"
            flops[name] = trunk_flops(hydra, tokens, m, hydra.model.spec)
        for name, graph in graphs.items():
            log(f"{shape.name}: exporting {name}")
            export_graph(graph, dense, paths[name], OPSET)
        fp32_names = list(graphs)
        if args.int8:
            for name in fp32_names:
                log(f"{shape.name}: quantizing {name} (dynamic int8)")
                paths[f"{name} int8"] = paths[name].with_suffix(".int8.onnx")
                quantize_graph(paths[name], paths[f"{name} int8"], "dynamic", work_dir=Path(tmp))
                flops[f"{name} int8"] = flops[name]
        sessions = {name: ort_session(path, args.threads) for name, path in paths.items()}
        order = ["single", "deep ensemble", *(name for name, _, _ in fusions)]
        order += [name for name in paths if name.endswith(" int8")]
        runs = {name: [sessions[name]] for name in sessions}
        runs["deep ensemble"] = [sessions["single"]] * m
        latency: dict[str, dict[int, float]] = {name: {} for name in order}
        for batch in BATCHES:
            log(f"{shape.name}: ONNX Runtime, batch {batch}, {len(order)} configurations")
            inputs = ort_inputs(dense, batch, args.seq_len, args.seed)
            medians = interleaved_medians(
                [ort_runner(runs[n], inputs) for n in order], args.warmup, args.repeats
            )
            for name, seconds in zip(order, medians, strict=True):
                latency[name][batch] = seconds
        inputs = ort_inputs(dense, 1, args.seq_len, args.seed)
        for name in order[2:]:
            fp32 = name.removesuffix(" int8")
            got = sessions[name].run(None, inputs)[0]
            with torch.inference_mode():
                want = graphs[fp32](**{k: torch.from_numpy(v) for k, v in inputs.items()})[0]
            gap = f"{float(np.abs(got - want.numpy()).max()):.1e}"
            # int8 is not parity but drift: its member logits' largest move from torch fp32
            gaps[name] = f"drift {gap}" if name != fp32 else f"{gaps[name]} / {gap}"
    rows = []
    for name in order:
        row = [shape.name, f"{name}" + ("" if name.startswith("single") else f" (M={m})")]
        row.append(f"{flops[name] / 1e9:.2f}")
        row.append(
            f"{flops[name] / flops['single']:.2f}x / {flops[name] / flops['deep ensemble']:.2f}x"
        )
        for batch in BATCHES:
            seconds = latency[name][batch]
            row.append(f"{seconds * 1000:.1f}")
            ratio_single = seconds / latency["single"][batch]
            ratio_ensemble = seconds / latency["deep ensemble"][batch]
            row.append(f"{ratio_single:.2f}x / {ratio_ensemble:.2f}x")
        row.append(gaps[name])
        rows.append(row)
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 layers, 3 repeats")
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--repeats", type=int, help="timed runs per latency (default 10, quick 3)")
    parser.add_argument("--warmup", type=int, help="untimed runs first (default 2, quick 1)")
    parser.add_argument("--members", type=int, default=3, help="ensemble size M (default 3)")
    parser.add_argument(
        "--shared",
        type=lambda s: [int(k) for k in s.split(",")],
        help="comma-separated K (default 0, L/4, L/2, 3L/4)",
    )
    parser.add_argument(
        "--mlp-ratios",
        type=lambda s: [float(r) for r in s.split(",")],
        default=[],
        help="comma-separated r: also a Hydra (K = 0) of members whose MLPs keep r of the "
        "neurons each (uqc prune --mlp-ratio r)",
    )
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", type=model_names, default=model_names("BERT-base"))
    parser.add_argument(
        "--int8", action="store_true", help="also each configuration dynamically int8-quantized"
    )
    args = parser.parse_args()
    if not 2 <= args.members <= 8 or not 1 <= args.threads <= MAX_THREADS:
        raise SystemExit(f"--members must be 2..8 and --threads 1..{MAX_THREADS}")
    args.repeats = args.repeats or (3 if args.quick else 10)
    args.warmup = args.warmup or (1 if args.quick else 2)
    if not 1 <= args.repeats <= 1000 or not 1 <= args.warmup <= 100:
        raise SystemExit("--repeats must be 1..1000 and --warmup 1..100")
    if not all(0 < r <= 1 for r in args.mlp_ratios) or len(args.mlp_ratios) > 8:
        raise SystemExit("--mlp-ratios takes at most 8 values, each in (0, 1]")
    if not 1 <= args.seq_len <= MAX_SEQ_LEN:
        raise SystemExit(f"--seq-len must be 1..{MAX_SEQ_LEN} (BERT's position table)")
    return args


def main() -> None:
    args = parse_args()
    import torch

    from uqcompress.models.loading import quiet_transformers

    quiet_transformers()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    headers = ["model", "configuration", "GFLOPs/example", "FLOPs vs single / DE"]
    for batch in BATCHES:
        headers += [f"ORT b{batch} (ms)", f"b{batch} vs single / DE"]
    headers.append("parity fused / ORT")
    rows = [
        row
        for shape in pruning_shapes(args.quick, args.models, [minilm_shape(args.quick)])
        for row in measure(shape, args)
    ]
    title = "Hydra with a shared trunk: ONNX Runtime CPU latency and FLOPs"
    table = Table(title, headers, rows, left=(0, 1))
    mode = "quick (shapes cut to few layers)" if args.quick else "full"
    print_report(environment_line(mode, time.perf_counter() - start), [table], args.markdown, "")


if __name__ == "__main__":
    main()
