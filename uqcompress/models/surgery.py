"""The only place that replaces modules inside a model, so shape surprises have one home.

Here: a fresh classifier (`replace_classifier`), head pruning and the kept-heads record
(`prune_heads`, `kept_heads`, `shape_to_kept_heads`), and `replace_module`, through which
SVE's SVD layers and member heads go in. Hydra fusion builds a new model
(`models/hydra_model.py`) instead of editing one. A head-pruned classifier is a model kind
of its own: `PRUNED` at the end declares it to the registry (`models/kinds.py`), with
`classifier_skeleton` to rebuild its shapes.

Surgery sits below the loader (which rebuilds every kind's skeleton through
`classifier_skeleton`), so it takes any object with a `LoadedModel`'s model, family, config
and labels (`Classifier`) rather than importing `models/loading.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from uqcompress.models.families.base import config_head_dim
from uqcompress.models.kind_base import KEPT_HEADS_KEY, ModelKind  # the ORIGINAL kept heads

# Per layer, the ORIGINAL indices of the MLP neurons a narrowed member kept (`narrow_mlp`)
KEPT_NEURONS_KEY = "uqc_kept_neurons"

if TYPE_CHECKING:
    from uqcompress.models.families import Family


class Classifier(Protocol):
    """What surgery reads and changes of a loaded model: a `models.loading.LoadedModel`."""

    model: Any
    family: Family
    config: Any
    labels: list[str]


@dataclass
class _Bare:
    """A classifier being built: just what surgery needs (`Classifier`)."""

    model: Any
    family: Family
    config: Any
    labels: list[str]


def replace_classifier(loaded: Classifier, labels: list[str], seed: int = 0) -> None:
    """Give the model a fresh linear classifier for ``labels`` (the same init as transformers).

    Used when a checkpoint had no trained head (an encoder), so the head's size comes from
    the data instead of the checkpoint's placeholder config.
    """
    import torch
    from torch import nn

    model: Any = loaded.model
    old = loaded.family.head_parts(model).classifier
    where = loaded.family.classifier_name(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = nn.Linear(old.in_features, len(labels), bias=old.bias is not None)
        nn.init.normal_(head.weight, std=float(getattr(loaded.config, "initializer_range", 0.02)))
        if head.bias is not None:
            nn.init.zeros_(head.bias)
    replace_module(model, where, head.to(old.weight.device, old.weight.dtype))
    model.num_labels = len(labels)
    model.config.num_labels = len(labels)
    model.config.id2label = dict(enumerate(labels))
    model.config.label2id = {name: i for i, name in enumerate(labels)}
    loaded.labels = list(labels)


def kept_heads(loaded: Classifier) -> list[list[int]]:
    """Per layer, the original indices of the heads the model still has."""
    recorded = getattr(loaded.config, KEPT_HEADS_KEY, None)
    if recorded is not None:
        return [list(map(int, layer)) for layer in recorded]
    heads = int(loaded.config.num_attention_heads)
    return [list(range(heads)) for _ in range(int(loaded.config.num_hidden_layers))]


def prune_heads(loaded: Classifier, keep: list[list[int]]) -> None:
    """Physically remove heads: keep, per layer, the heads at *current* indices `keep[l]`.

    Q/K/V lose the rows of removed heads (weights and biases), the output projection loses
    their columns (its bias stays). Layers may end with different head counts, or none.
    The config records the kept heads as original indices, so pruning composes and loading
    can rebuild the same shapes.
    """
    import torch

    layers = loaded.family.attention_layers(loaded.model)
    if len(keep) != len(layers):
        raise ValueError(f"keep lists for {len(keep)} layers, the model has {len(layers)}")
    d = config_head_dim(loaded.config)  # `head_gates.head_dim`, without the loader's type
    before = kept_heads(loaded)
    for layer, (parts, heads) in enumerate(zip(layers, keep, strict=True)):
        current = parts.output.in_features // d
        if sorted(set(heads)) != list(heads) or any(not 0 <= h < current for h in heads):
            raise ValueError(
                f"layer {layer}: keep {heads} is not a sorted subset of 0..{current - 1}"
            )
        # The rows of head h are h*d .. h*d + d - 1 in Q, and the same columns in O.
        index = torch.tensor([h * d + i for h in heads for i in range(d)], dtype=torch.long)
        # K/V: the key/value heads the kept query heads read (all of them without GQA).
        kv_index = torch.tensor(
            [g * d + i for g in kept_kv_heads(parts, heads, layer) for i in range(d)],
            dtype=torch.long,
        )

        out = _linear(len(index), parts.output.out_features, parts.output.bias is not None)
        with torch.no_grad():
            out.weight.copy_(parts.output.weight[:, index])
            if parts.output.bias is not None:
                out.bias.copy_(parts.output.bias)
        out = out.to(parts.output.weight.device, parts.output.weight.dtype)
        new_parts = replace(
            parts,
            query=_rows(parts.query, index),
            key=_rows(parts.key, kv_index),
            value=_rows(parts.value, kv_index),
            output=out,
        )
        loaded.family.set_attention_layer(loaded.model, layer, new_parts, len(heads))
    composed = [[before[layer][h] for h in heads] for layer, heads in enumerate(keep)]
    setattr(loaded.model.config, KEPT_HEADS_KEY, composed)
    loaded.config = loaded.model.config


def narrow_mlp(loaded: Classifier, keep: list[list[int]]) -> None:
    """Physically remove MLP intermediate neurons: keep, per layer, the neurons at *current*
    indices `keep[l]`, the same count in every layer (the config has one width).

    Up (and gate) lose the rows of removed neurons, down loses their columns (its bias
    stays). The family's width key (`Family.mlp_width_key`) gets the new width, and the
    config records the kept neurons as original indices (`KEPT_NEURONS_KEY`), so narrowing
    composes.
    """
    import torch

    family, config = loaded.family, loaded.model.config
    if family.mlp_width_key is None:
        raise ValueError(f"{family.name}'s MLP width is not a config key: it cannot be narrowed")
    blocks = family.mlp_layers(loaded.model)
    if len(keep) != len(blocks) or len({len(k) for k in keep}) != 1:
        raise ValueError(f"keep lists must be one per layer ({len(blocks)}), all of one length")
    inner = blocks[0].up.out_features
    before = getattr(config, KEPT_NEURONS_KEY, None) or [list(range(inner)) for _ in blocks]
    for layer, (mlp, neurons) in enumerate(zip(blocks, keep, strict=True)):
        current = mlp.up.out_features
        if sorted(set(neurons)) != list(neurons) or any(not 0 <= i < current for i in neurons):
            raise ValueError(
                f"layer {layer}: keep {neurons} is not a sorted subset of 0..{current - 1}"
            )
        index = torch.tensor(neurons, dtype=torch.long)
        with torch.no_grad():
            for linear in (mlp.up, mlp.gate):
                if linear is None:
                    continue
                linear.weight = torch.nn.Parameter(linear.weight[index].clone())
                if linear.bias is not None:
                    linear.bias = torch.nn.Parameter(linear.bias[index].clone())
                linear.out_features = len(neurons)
            mlp.down.weight = torch.nn.Parameter(mlp.down.weight[:, index].clone())
            mlp.down.in_features = len(neurons)
    setattr(config, family.mlp_width_key, len(keep[0]))
    composed = [[before[layer][i] for i in neurons] for layer, neurons in enumerate(keep)]
    setattr(config, KEPT_NEURONS_KEY, composed)
    loaded.config = config


def kept_kv_heads(parts: Any, heads: list[int], layer: int) -> list[int]:
    """The key/value heads that query heads `heads` read (current indices), for grouped-query
    attention: query head h reads key/value head h // group_size, and every kept key/value
    head must keep the same number of query heads (the attention repeats each K/V head that
    many times). Without grouping, the kept heads themselves.
    """
    group = parts.group_size
    if group <= 1:
        return list(heads)
    readers: dict[int, int] = {}
    for h in heads:
        readers[h // group] = readers.get(h // group, 0) + 1
    if len(set(readers.values())) > 1:
        raise ValueError(
            f"layer {layer}: kept query heads {heads} leave key/value heads with "
            f"{sorted(set(readers.values()))} query heads each; grouped-query attention needs "
            "the same number for every kept key/value head"
        )
    return sorted(readers)


def _linear(in_features: int, out_features: int, bias: bool) -> Any:
    """An uninitialised-looking Linear (its values are overwritten by the caller); zero-sized
    ones are legal here, so torch's warning about initialising them is noise."""
    import warnings

    from torch import nn

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
        return nn.Linear(in_features, out_features, bias=bias)


def _rows(linear: Any, index: Any) -> Any:
    """A copy of `linear` keeping only the output rows in `index` (weights and bias)."""
    import torch

    new = _linear(linear.in_features, len(index), linear.bias is not None)
    with torch.no_grad():
        new.weight.copy_(linear.weight[index])
        if linear.bias is not None:
            new.bias.copy_(linear.bias[index])
    return new.to(linear.weight.device, linear.weight.dtype)


def shape_to_kept_heads(loaded: Classifier, kept: list[list[int]]) -> None:
    """Give a freshly built full model the shapes of a pruned checkpoint (before loading it)."""
    if hasattr(loaded.model.config, KEPT_HEADS_KEY):
        delattr(loaded.model.config, KEPT_HEADS_KEY)  # the fresh model still has every head
    prune_heads(loaded, kept)


def replace_module(model: Any, name: str, new: Any) -> Any:
    """Put `new` where the submodule `name` (dotted, as in `named_modules`) was; returns the
    old module. SVE's SVD layers and its per-member heads go in through here."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = getattr(parent, child)
    setattr(parent, child, new)
    return old


def classifier_skeleton(config: Any, family: Any) -> Any:
    """The classifier `config` describes, cut to the heads it records as kept (a pruned
    model, or the base of an SVE or DIRECTOR model made from one): shapes to load weights
    into. Building it leaves the global RNG as it was."""
    import torch

    with torch.random.fork_rng(devices=[]):
        model = family.classifier_class()(config)
        kept = getattr(config, KEPT_HEADS_KEY, None)
        if kept is not None:
            base = _Bare(model=model, family=family, config=config, labels=[])  # labels unread
            shape_to_kept_heads(base, [list(map(int, layer)) for layer in kept])
    return model


PRUNED = ModelKind(
    name="pruned",
    key=KEPT_HEADS_KEY,
    described="a head-pruned classifier",
    noun="pruned model",
    remake="uqc prune",
    skeleton=classifier_skeleton,
)
