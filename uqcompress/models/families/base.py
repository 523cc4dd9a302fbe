"""What a model family must say about itself: presets, config, classes, and its anatomy.

The anatomy is everything a method needs to read, copy or run part of a network without
knowing which architecture it is: the embeddings, the list of blocks, each block's attention
(Q/K/V/O, heads, key/value heads, head_dim), MLP (gated or not) and norms, the norm order
(pre-LN or post-LN), the head after the last block (final norm, pooler, classifier), and how
hidden states flow between them:

    hidden, mask = family.embed(family.embeddings(model), inputs)
    for block in family.blocks(model):
        hidden = family.run_block(block, hidden, mask)
    logits = family.head(model, hidden, inputs.get("attention_mask"))

reproduces `model(**inputs).logits` exactly (tests/models/test_anatomy.py). Head gates,
pruning surgery, Hydra fusion, SVE targets and DIRECTOR's re-partition read only this, so a
new family is one file here (and its entry in the family conformance test).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel

InputKind = Literal["text", "image"]
NormOrder = Literal["pre", "post"]
NormKind = Literal["layernorm", "rmsnorm"]
# What the head reads: the first token (CLS), the last attended one (decoders), or the first
# token beside the mean of the others (DINOv2: `[CLS ; mean(patches)]`, twice the width).
PooledToken = Literal["first", "last", "first_and_mean"]

# Config keys every family's blocks are sized by: the start of each family's `shape_keys`.
BLOCK_SHAPE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
)


def config_head_dim(config: Any) -> int:
    """Width d_h of one attention head: `config.head_dim` where the config sets it (families
    whose heads are not hidden / heads wide), else `hidden_size // num_attention_heads`.

    The one place head_dim is read: gates, surgery, scoring, the Hydra model and DIRECTOR's
    transition all use it, so a family with its own head width needs no edit elsewhere.
    """
    explicit = getattr(config, "head_dim", None)
    if explicit:
        return int(explicit)
    return int(config.hidden_size) // int(config.num_attention_heads)


def label_fields(labels: list[str]) -> dict[str, Any]:
    """The config fields that name the classes (every family's `build_config` passes them)."""
    return {
        "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)},
    }


def text_config_values(
    preset: dict[str, Any], overrides: dict[str, Any], defaults: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Config values of a new text classifier made by `uqc init`: the shipped WordPiece
    vocabulary and its padding id 0, then the family's `defaults`, the preset's values and
    the user's `--set` overrides, later ones winning."""
    from uqcompress.models.tokenizer import shipped_vocab_size

    values: dict[str, Any] = {"vocab_size": shipped_vocab_size(), "pad_token_id": 0}
    values.update(defaults or {})
    values.update(preset)
    values.update(overrides)
    return values


def additive_mask(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Shape: `[B, T]` 1/0 mask -> additive `[B, 1, 1, T]` (0 where attended, dtype-min where
    not), or None without a mask: what bidirectional families' blocks take."""
    if attention_mask is None:
        return None
    import torch

    keep = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - keep) * torch.finfo(dtype).min


@dataclass(frozen=True)
class AttentionParts:
    """The projections of one attention layer: what head gates, scoring, pruning and Hydra
    fusion read, and what `Family.set_attention_layer` installs after pruning.

    Head h owns rows `h*d_h .. h*d_h + d_h - 1` of `query` and columns of `output`; with
    grouped key/value heads (`kv_heads < heads`) `key`/`value` have `kv_heads * d_h` rows.
    A layer pruned to no heads keeps 0-row projections (`heads == 0`).
    """

    query: nn.Linear
    key: nn.Linear
    value: nn.Linear
    output: nn.Linear
    head_dim: int
    # Per-head norms over head_dim on queries and keys, before rotary positions (Qwen3).
    query_norm: nn.Module | None = None
    key_norm: nn.Module | None = None

    @property
    def heads(self) -> int:
        """Query heads this layer has now (fewer than the config's after pruning)."""
        return int(self.output.in_features) // self.head_dim

    @property
    def kv_heads(self) -> int:
        """Key/value heads (equal to `heads` unless the family groups them)."""
        return int(self.key.out_features) // self.head_dim

    @property
    def group_size(self) -> int:
        """Query heads reading each key/value head (1 without grouped-query attention).
        Query head h reads key/value head h // group_size."""
        return self.heads // self.kv_heads if self.kv_heads else 0


def last_token_index(attention_mask: torch.Tensor | None, batch: int, length: int) -> Any:
    """Shape: `[B, T]` 1/0 -> `[B]` index of each row's last real token (T - 1 without a
    mask): right padding and left padding alike."""
    import torch

    if attention_mask is None:
        return torch.full((batch,), length - 1, dtype=torch.long)
    positions = torch.arange(length, device=attention_mask.device)
    return (positions * attention_mask.to(positions.dtype)).argmax(-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of queries or keys, as transformers' Llama applies it.

    Shape: x `[B, H, T, d_h]`, cos/sin `[B or 1, T, d_h]` -> `[B, H, T, d_h]`.
    """
    import torch

    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos[:, None]) + (rotated * sin[:, None])


@dataclass(frozen=True)
class MlpParts:
    """The feed-forward of one block: `down(act(up(x)))`, or gated `down(act(gate(x)) * up(x))`.

    Shape: up `[d] -> [I]`, gate (if any) `[d] -> [I]`, down `[I] -> [d]`.
    """

    up: nn.Linear
    down: nn.Linear
    activation: str  # a transformers ACT2FN name (config.hidden_act)
    gate: nn.Linear | None = None

    @property
    def gated(self) -> bool:
        return self.gate is not None


@dataclass(frozen=True)
class BlockParts:
    """One transformer block: an attention sublayer, then an MLP sublayer, each with a norm.

    Pre-LN (`Layout.norm_order == "pre"`): `x + attn(norm_attention(x))`, then
    `x + mlp(norm_mlp(x))`. Post-LN: `norm_attention(x + attn(x))`, then
    `norm_mlp(x + mlp(x))`.
    """

    attention: AttentionParts
    mlp: MlpParts
    norm_attention: nn.Module
    norm_mlp: nn.Module
    # Layer scale (DINOv2): a learned `[d]` vector multiplying each sublayer's output before
    # its residual add; None where the family has none (`Layout.layer_scale`).
    attention_scale: torch.Tensor | None = None
    mlp_scale: torch.Tensor | None = None


@dataclass(frozen=True)
class BlockSizes:
    """The sizes and rates of every block of a model, read from its config alone (what a
    method that builds its own blocks, like the Hydra model, needs before any weights)."""

    hidden: int
    intermediate: int
    norm_eps: float
    activation: str  # a transformers ACT2FN name
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    mlp_bias: bool = True  # whether the MLP's linears have biases
    gated_mlp: bool = False  # down(act(gate(x)) * up(x)) (a config may choose it: DINOv2)


@dataclass(frozen=True)
class HeadParts:
    """What runs after the last block: `classifier(dropout(act(pooler(final_norm(h)[token]))))`,
    each optional part skipped when None (`Layout` says which token and activation)."""

    final_norm: nn.Module | None  # pre-LN families' norm after the last block
    pooler: nn.Linear | None  # a dense layer on the pooled token (BERT), with `pooler_activation`
    classifier: nn.Linear  # the last linear: hidden (or pooler) width -> classes


@dataclass(frozen=True)
class Layout:
    """Facts that hold for every model of a family, readable before any weights exist (what
    a method that builds its own modules, like the Hydra model, decides from)."""

    norm_order: NormOrder
    norm: NormKind
    gated_mlp: bool
    final_norm: bool  # a norm after the last block (`HeadParts.final_norm`)
    pooler_activation: str | None  # ACT2FN name of the pooler's activation; None: no pooler
    pooled_token: PooledToken = "first"  # what the head reads (see PooledToken)
    layer_scale: bool = False  # sublayer outputs scaled by a learned vector (DINOv2)
    qk_norm: bool = False  # per-head norms on queries and keys (Qwen3)
    causal: bool = False  # query t attends keys <= t only (decoders); HIES's AE reads it

    @property
    def pooled_width(self) -> int:
        """The classifier's input width in units of the hidden size."""
        return 2 if self.pooled_token == "first_and_mean" else 1


@dataclass(frozen=True)
class DropoutSites:
    """Where a family's classifier applies its hidden dropout, as MC Dropout masks it: always
    the embeddings' output and, per block, the attention output projection's and the MLP down
    projection's outputs (read from the anatomy); `classifier`: also the pooled features
    before the classifier (BERT's `dropout`; ViT has none there)."""

    classifier: bool


class Family(ABC):
    """One transformers architecture family. Adding a family = one new file like bert.py.

    Anatomy methods take modules (not only whole models) where a method keeps copies of parts
    (DIRECTOR keeps the embeddings, the last MLP sublayer and the head; Hydra builds its own
    embeddings): `embed`, `run_block`, `run_mlp_sublayer` and `run_head` work on those.
    """

    name: str
    model_types: tuple[str, ...]
    input_kind: InputKind
    presets: ClassVar[dict[str, dict[str, Any]]]
    layout: ClassVar[Layout]
    # Keys the family's transformers model reads although its config class does not declare
    # them (`uqc init --set` accepts them).
    extra_config_keys: ClassVar[tuple[str, ...]] = ()
    # Config keys that must agree for models to share one residual-stream shape and MLP (Hydra
    # refuses members that differ at one, naming the first): `BLOCK_SHAPE_KEYS`, then the
    # family's norm eps, vocabulary, positions, image and patch sizes.
    shape_keys: ClassVar[tuple[str, ...]]
    # MC Dropout's sites in this family's classifier; None where they are not mapped (and
    # tested): MC Dropout refuses the family. Not inherited blindly: a subclass with other
    # modules sets its own (or None).
    dropout_sites: ClassVar[DropoutSites | None] = None
    # The config key of the MLP's intermediate width, which `prune --mlp-ratio` sets; None
    # where the width is derived (DINOv2's mlp_ratio): narrowing refuses the family.
    mlp_width_key: ClassVar[str | None] = "intermediate_size"

    # --- building --------------------------------------------------------------------------

    @abstractmethod
    def build_config(
        self,
        preset: str,
        overrides: dict[str, Any],
        labels: list[str],
        image_size: int | None = None,
        patch_size: int | None = None,
    ) -> PretrainedConfig:
        """A transformers config for a new, untrained classifier."""

    @abstractmethod
    def classifier_class(self) -> type[PreTrainedModel]:
        """The transformers class of this family's classifier."""

    @abstractmethod
    def build_embeddings(self, config: PretrainedConfig) -> nn.Module:
        """A fresh embeddings module of the family's shape (weights to be loaded or copied)."""

    def max_length(self, config: PretrainedConfig) -> int | None:
        """The longest input (tokens) the model accepts; None for images."""
        return None

    def fixed_tokens(self, config: PretrainedConfig) -> int | None:
        """Tokens every input has (an image model: patches + CLS); None where it varies."""
        return None

    def classifier_dropout(self, config: PretrainedConfig) -> float:
        """Dropout probability on the pooled features before the classifier."""
        return 0.0

    def sizes(self, config: PretrainedConfig) -> BlockSizes:
        """Block sizes from the config; this default reads BERT/ViT-style keys."""
        return BlockSizes(
            hidden=int(config.hidden_size),
            intermediate=int(config.intermediate_size),
            norm_eps=float(config.layer_norm_eps),
            activation=str(config.hidden_act),
            attention_dropout=float(getattr(config, "attention_probs_dropout_prob", 0.0) or 0.0),
            hidden_dropout=float(getattr(config, "hidden_dropout_prob", 0.0) or 0.0),
            gated_mlp=self.layout.gated_mlp,
        )

    def member_norm(self, members: int, width: int, eps: float) -> nn.Module:
        """This family's norm with its own weights per member, over `width` features: what the
        Hydra model builds for each norm of the blocks, the head and the q/k norms.

        This default picks by `layout.norm` (LayerNorm or Llama's RMSNorm). A family whose
        norm computes something else overrides it with its own per-member module: `weight`
        `[M, width]` and `bias` `[M, width]` or None, which Hydra fusion fills by stacking the
        members' norms. Shape (of the module): `[M*B, ..., width]` member-major -> same.
        """
        from uqcompress.models.member_norms import MemberLayerNorm, MemberRMSNorm

        if self.layout.norm == "rmsnorm":
            return MemberRMSNorm(members, width, eps)
        return MemberLayerNorm(members, width, eps)

    def check_loadable(self, config: PretrainedConfig, where: str) -> None:
        """Refuse, with one line, a checkpoint of this model_type that uqc cannot load as this
        family's classifier (e.g. another head class). The default accepts every one."""
        return None

    # --- embeddings ------------------------------------------------------------------------

    @abstractmethod
    def embeddings(self, model: nn.Module) -> nn.Module:
        """The classifier's embeddings module (its output is the first residual stream)."""

    @abstractmethod
    def embed(
        self, embeddings: nn.Module, inputs: Mapping[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run `embeddings` (the model's or a copy) on model inputs.

        Shape: inputs `[B, ...]` -> hidden `[B, T, d]` and the mask every block takes
        (additive, `[B, 1, 1, T]`; `[B, 1, T, T]` for causal families), or None.
        """

    # --- blocks ----------------------------------------------------------------------------

    @abstractmethod
    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The transformer blocks, in order."""

    @abstractmethod
    def attention_parts(self, block: nn.Module, head_dim: int) -> AttentionParts:
        """The attention projections of one block (`head_dim` from `config_head_dim`)."""

    @abstractmethod
    def block_parts(self, block: nn.Module, config: PretrainedConfig) -> BlockParts:
        """Attention, MLP and norms of one block."""

    def attention_layers(self, model: nn.Module) -> list[AttentionParts]:
        """The attention projections of every layer, in layer order."""
        config: Any = getattr(model, "config", None)
        head_dim = config_head_dim(config)
        return [self.attention_parts(block, head_dim) for block in self.blocks(model)]

    def mlp_layers(self, model: nn.Module) -> list[MlpParts]:
        """The MLP of every layer, in layer order."""
        config: Any = getattr(model, "config", None)
        return [self.block_parts(block, config).mlp for block in self.blocks(model)]

    def rotary_positions(
        self, config: PretrainedConfig, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """cos and sin of the rotary positions 0..T-1 (families with rotary attention: apply
        them with `rotate` to queries and keys), or None (positions are in the embeddings).

        Shape: hidden `[B, T, d]` -> cos, sin `[1, T, d_h]`.
        """
        return None

    def run_block(
        self, block: nn.Module, hidden: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """One block, as the model runs it. Shape: `[B, T, d]`, mask from `embed` -> `[B, T, d]`."""
        out = block(hidden, attention_mask=mask)
        return out[0] if isinstance(out, tuple) else out

    @abstractmethod
    def mlp_sublayer(self, block: nn.Module) -> dict[str, nn.Module]:
        """The modules of the block's MLP sublayer, by name: everything after the attention
        residual add (and, post-LN, its norm). The first one takes the residual stream as its
        first input (`mlp_entry`). DIRECTOR keeps copies of these as `last_<name>`."""

    @abstractmethod
    def run_mlp_sublayer(
        self, modules: Mapping[str, nn.Module], hidden: torch.Tensor
    ) -> torch.Tensor:
        """The MLP sublayer on the stream after the attention sublayer, from `mlp_sublayer`'s
        modules (or copies). Shape: `[B, T, d]` -> `[B, T, d]` (the block's output)."""

    def mlp_entry(self, block: nn.Module) -> nn.Module:
        """The module whose first input is the residual stream right after the block's
        attention sublayer (where DIRECTOR re-partitions the network)."""
        return next(iter(self.mlp_sublayer(block).values()))

    @abstractmethod
    def set_attention_layer(
        self, model: nn.Module, layer: int, parts: AttentionParts, heads: int
    ) -> None:
        """Install new projections for `heads` heads in `layer` (only surgery.py calls this).

        With `heads == 0` the attention core is replaced by a module that returns the output
        projection's bias: exactly what the fully gated layer computes, without the zero-head
        reshape that crashes transformers' attention.
        """

    # --- head ------------------------------------------------------------------------------

    @abstractmethod
    def head_parts(self, model: nn.Module) -> HeadParts:
        """Final norm, pooler and classifier linears (what Hydra stacks per member)."""

    @abstractmethod
    def head_modules(self, model: nn.Module) -> dict[str, nn.Module]:
        """The modules after the last block, by name, in the order they run (classifier
        last): what `run_head` takes. DIRECTOR keeps copies of these under the same names."""

    @abstractmethod
    def run_head(
        self,
        modules: Mapping[str, nn.Module],
        hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits from the last block's output, with `head_modules`' modules (or copies).

        Shape: hidden `[B, T, d]`, attention_mask `[B, T]` 1/0 (read by families that pool
        the last attended token) -> logits `[B, C]`.
        """

    def head(
        self, model: nn.Module, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`run_head` with the model's own head. Shape: `[B, T, d]` -> `[B, C]`."""
        return self.run_head(self.head_modules(model), hidden, attention_mask)

    def classifier_name(self, model: nn.Module) -> str:
        """The dotted module name of `head_parts(model).classifier` (for `replace_module`)."""
        classifier = self.head_parts(model).classifier
        return next(name for name, module in model.named_modules() if module is classifier)
