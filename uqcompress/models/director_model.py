"""The DIRECTOR student (docs/methods/director.md): the teacher's block stack as a reverse
diffusion process, replaced by one small time-conditioned transition block that samples.

Re-partitioning: state x_l is the residual stream right after layer l's attention sublayer
(`Family.mlp_entry`'s input: ViT's `layernorm_after`; BERT, post-LN: the attention sublayer's
output, the input of `intermediate`); x_0 is the input of the first replaced layer (the
embedding output, or the output of the last kept layer with `replace_last`). Transition 1 is
attention of the first replaced layer; transition l > 1 is the MLP of layer l-1, then
attention of layer l. The head is the last layer's MLP sublayer (`Family.mlp_sublayer`) and
the family's head (`Family.head_modules`: final norm or pooler, and the classifier).

The student keeps the teacher's embeddings, kept prefix layers and head, and replaces the K
transitions by one shared DiT block stack (adaLN-Zero conditioned on a timestep embedding of
the step index) with a residual mean head and a positive std head. One step:
x_l = mu_theta(x_{l-1}, t) + s_theta(x_{l-1}, t) * xi, xi ~ N(0, I).

The layout (`DirectorSpec`) lives in the transformers config under `uqc_director`, so
`director_skeleton` rebuilds a saved student's shapes before its weights load; `DIRECTOR` at
the end declares the kind to the registry (`models/kinds.py`). Distilling a
student from a teacher (teacher states, losses, the loop) is the method, in
`methods/director.py` and `methods/director_distill.py`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from uqcompress.errors import ConfigError
from uqcompress.models.families import FAMILIES, Family, family_named
from uqcompress.models.families.base import config_head_dim
from uqcompress.models.kind_base import DIRECTOR_KEY, ModelKind  # DIRECTOR_KEY: the DirectorSpec's
from uqcompress.models.outputs import MemberOutput

if TYPE_CHECKING:
    from collections.abc import Callable

STD_FLOOR = 1e-4  # docs/methods/director.md: softplus + floor keeps the std strictly positive
# The inputs an example's noise is keyed on (uq/noise.py): what the exported graph takes.
NOISE_KEYS = ("input_ids", "attention_mask", "token_type_ids", "pixel_values")
# The student's children that are not its head.
NEVER_HEAD = ("embeddings", "prefix", "transition")


@dataclass(frozen=True)
class DirectorSpec:
    """The student's layout, stored in its config."""

    replace_last: int  # K: transitions the student replaces (the first L - K layers stay)
    depth: int  # DiT blocks in the shared transition
    samples: int  # S: roll-outs averaged at inference
    seed: int  # of the inference noise when none is given
    train_head: bool = True  # the teacher's head trains with the transition

    def to_dict(self) -> dict[str, Any]:
        return {
            "members": self.samples,  # what eval and export count as M
            "replace_last": self.replace_last,
            "depth": self.depth,
            "samples": self.samples,
            "seed": self.seed,
            "train_head": self.train_head,
        }

    @classmethod
    def from_config(cls, config: Any) -> DirectorSpec:
        raw = getattr(config, DIRECTOR_KEY)
        return cls(
            replace_last=int(raw["replace_last"]),
            depth=int(raw["depth"]),
            samples=int(raw["samples"]),
            seed=int(raw["seed"]),
            train_head=bool(raw.get("train_head", True)),
        )


# --- the families it re-partitions --------------------------------------------------------


def director_families() -> tuple[str, ...]:
    """Families DIRECTOR can re-partition: every registered one (it needs only the anatomy:
    embeddings, blocks, the MLP sublayer's entry, and the head)."""
    return tuple(FAMILIES)


def director_family(family: Family | str) -> Family:
    """The family, or the refusal for one DIRECTOR does not know."""
    found = family_named(family)
    if found is None:
        name = family if isinstance(family, str) else family.name
        raise ConfigError(
            f"DIRECTOR does not support the {name} family",
            hint=f"supported: {', '.join(director_families())}",
        )
    return found


# --- the student's transition --------------------------------------------------------------


class TimestepEmbedder(nn.Module):
    """DiT's timestep embedding: sinusoidal features, then a 2-layer MLP.

    Shape: t `[N]` (integers) -> `[N, hidden]`.
    """

    def __init__(self, hidden: int, frequencies: int = 256) -> None:
        super().__init__()
        self.frequencies = frequencies
        self.mlp = nn.Sequential(
            nn.Linear(frequencies, hidden), nn.SiLU(), nn.Linear(hidden, hidden)
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.frequencies // 2
        exponents = torch.arange(half, dtype=torch.float32, device=t.device) / half
        freqs = torch.exp(-math.log(10000.0) * exponents)
        angles = t.float()[:, None] * freqs[None]
        features = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
        first: Any = self.mlp[0]
        return self.mlp(features.to(first.weight.dtype))


class DiTBlock(nn.Module):
    """A DiT block with adaLN-Zero: LayerNorms without affine, shift/scale/gate from the
    condition, the modulation initialised to zero so the block starts as the identity.

    Shape: x `[B, T, d]`, condition `[B, d]`, additive mask `[B, 1, 1, T]` or None -> x.
    """

    def __init__(self, hidden: int, heads: int, head_dim: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(hidden, 3 * heads * head_dim)
        self.proj = nn.Linear(heads * head_dim, hidden)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        inner = int(hidden * mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, inner), nn.GELU(approximate="tanh"), nn.Linear(inner, hidden)
        )
        modulation = nn.Linear(hidden, 6 * hidden)
        nn.init.zeros_(modulation.weight)  # adaLN-Zero: every block starts as the identity
        nn.init.zeros_(modulation.bias)
        self.modulation = nn.Sequential(nn.SiLU(), modulation)

    def forward(
        self, x: torch.Tensor, condition: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(condition)[:, None, :].chunk(
            6, dim=-1
        )
        h = self.norm1(x) * (1 + scale1) + shift1
        batch, length, _ = h.shape
        width = self.heads * self.head_dim
        qkv = self.qkv(h).reshape(batch, length, 3, self.heads, self.head_dim)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, T, d_h]
        attended = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
        x = x + gate1 * self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        h = self.norm2(x) * (1 + scale2) + shift2
        return x + gate2 * self.mlp(h)


class Transition(nn.Module):
    """The shared time-conditioned transition: DiT blocks, a residual mean head and a
    positive std head (each LayerNorm -> Linear -> activation, as in the DIRECTOR code).

    Shape: x `[B, T, d]`, step `int`, mask -> mean, std `[B, T, d]`.
    """

    def __init__(self, hidden: int, heads: int, head_dim: int, depth: int) -> None:
        super().__init__()
        self.time = TimestepEmbedder(hidden)
        self.blocks = nn.ModuleList(DiTBlock(hidden, heads, head_dim) for _ in range(depth))
        self.mean_head = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.GELU())
        self.std_head = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden))

    def forward(
        self, x: torch.Tensor, step: int, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.full((x.shape[0],), step, dtype=torch.long, device=x.device)
        condition = self.time(t)
        h = x
        for block in self.blocks:
            h = block(h, condition, mask)
        mean = h + self.mean_head(h)
        std = F.softplus(self.std_head(h)) + STD_FLOOR
        return mean, std


# --- the student ---------------------------------------------------------------------------


class DirectorModel(nn.Module):
    """Teacher embeddings (+ kept prefix layers) -> K sampled transitions -> teacher head.

    Call it like the teacher; it returns `MemberOutput` with S sampled roll-outs. `noise`
    `[B, S, K, T, d]` makes the draws explicit (ONNX Runtime's random numbers are not
    torch's); without it, in eval mode each example draws from its own generator seeded by
    the spec's seed and the example's content (uq/noise.py: the same input gets the same
    prediction in any batch, here and in the Predictor); in training mode the draws are fresh.

    The frozen parts (embeddings, kept prefix layers, and the head unless it trains) stay in
    eval mode whatever `train()` says: like the teacher whose states they reproduce, they
    run without dropout.

    Shape: inputs `[B, ...]` -> member_logits `[B, S, C]`.
    """

    def __init__(self, teacher: nn.Module, family: Family | str, spec: DirectorSpec) -> None:
        super().__init__()
        anatomy = director_family(family)
        config: Any = getattr(teacher, "config", None)
        self.config = config
        self.family, self.spec = anatomy, spec
        layers = anatomy.blocks(teacher)
        first = len(layers) - spec.replace_last
        self.embeddings = copy.deepcopy(anatomy.embeddings(teacher))
        self.prefix = nn.ModuleList(copy.deepcopy(layer) for layer in layers[:first])
        hidden = int(config.hidden_size)
        self.transition = Transition(
            hidden, int(config.num_attention_heads), config_head_dim(config), spec.depth
        )
        # The head: copies of the last block's MLP sublayer (as `last_<name>`), then of the
        # family's head modules under their own names (the checkpoint's keys).
        tail = anatomy.mlp_sublayer(layers[-1])
        head = anatomy.head_modules(teacher)
        copies = {f"last_{name}": module for name, module in tail.items()} | head
        for name, module in copies.items():
            if hasattr(self, name):  # e.g. a head module called "head" would hide the method
                raise ValueError(f"the {anatomy.name} head's {name!r} clashes with DirectorModel")
            setattr(self, name, copy.deepcopy(module))
        self._tail_names, self._head_names = list(tail), list(head)  # names only, no modules
        # Samples per inference pass (None: `chunk_samples` sizes it); a runtime setting,
        # never saved: it changes memory and speed, not the result.
        self.sample_chunk: int | None = None

    def frozen_parts(self) -> list[nn.Module]:
        """The modules that never train: embeddings, kept prefix, and the head unless
        `spec.train_head`."""
        parts: list[nn.Module] = [self.embeddings, self.prefix]
        if not self.spec.train_head:
            parts += [m for name, m in self.named_children() if name not in NEVER_HEAD]
        return parts

    def train(self, mode: bool = True) -> DirectorModel:
        """As `nn.Module.train`, but the frozen parts stay in eval mode (no dropout)."""
        super().train(mode)
        for part in self.frozen_parts():
            part.eval()
        return self

    @property
    def members(self) -> int:
        return self.spec.samples

    @property
    def steps(self) -> int:
        return self.spec.replace_last

    def image_tokens(self) -> int | None:
        """Tokens of an image model (patches + CLS); None for text (it varies)."""
        return self.family.fixed_tokens(self.config)

    def noise_shape(self, batch: int, tokens: int) -> tuple[int, int, int, int, int]:
        """Shape of the `noise` input: `[B, S, K, T, d]`."""
        hidden = int(self.config.hidden_size)
        return (batch, self.spec.samples, self.steps, tokens, hidden)

    def start_state(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x_0 and the additive attention mask. Shape: `[B, T, d]`, `[B, 1, 1, T]` or None."""
        x, mask = self.family.embed(self.embeddings, inputs)
        for layer in self.prefix:
            x = self.family.run_block(layer, x, mask)
        return x, mask

    def head(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The teacher's last MLP sublayer, then its head (final norm or pooler, classifier).

        Shape: x `[B, T, d]`, attention_mask `[B, T]` 1/0 (read only by families whose head
        pools the last attended token) -> `[B, C]`.
        """
        tail = {name: getattr(self, f"last_{name}") for name in self._tail_names}
        head = {name: getattr(self, name) for name in self._head_names}
        h = self.family.run_mlp_sublayer(tail, x)
        return self.family.run_head(head, h, attention_mask)

    def rollout(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        noise: torch.Tensor | torch.Generator | Callable[[], torch.Tensor] | None,
        rows: int | None = None,
    ) -> torch.Tensor:
        """K sampled steps from x_0. Shape: x `[N, T, d]` -> x_K `[N, T, d]`. `noise`: the
        draws `[K, N, T, d]`, a generator to draw each step's `[N, T, d]` from, a function
        returning the next step's `[N, T, d]` (both keep one step's noise in memory), or
        None for the means only. `rows`: run the transition on at most this many of the N
        sequences at a time (the same draws, so the same result; activations, attention's
        above all, grow with the rows of one pass)."""
        # The transition computes in its own dtype (float32 when the teacher's frozen parts
        # are bfloat16, `--dtype`): the state between its steps keeps that precision.
        x = x.to(next(self.transition.parameters()).dtype)
        if mask is not None and mask.is_floating_point():  # additive: in the same dtype
            mask = mask.to(x.dtype)
        for step in range(self.steps):
            if noise is None:
                draw = None
            elif isinstance(noise, torch.Generator):
                draw = torch.randn(x.shape, generator=noise, device=x.device).to(x.dtype)
            elif isinstance(noise, torch.Tensor):
                draw = noise[step]
            else:
                draw = noise()
            if draw is not None:
                draw = draw.to(x.dtype)
            x = self._step(x, step, mask, draw, rows)
        return x

    def _head_dtype(self) -> torch.dtype:
        """The dtype the head computes in (float32 when it trains, else the teacher's): its
        first weight's; the embeddings' if it has none."""
        names = [*(f"last_{n}" for n in self._tail_names), *self._head_names]
        for module in (getattr(self, name) for name in names):
            for param in module.parameters():
                return param.dtype
        return next(self.embeddings.parameters()).dtype

    def _step(
        self,
        x: torch.Tensor,
        step: int,
        mask: torch.Tensor | None,
        draw: torch.Tensor | None,
        rows: int | None,
    ) -> torch.Tensor:
        """One transition, on slices of at most `rows` sequences. Shape: x, draw `[N, T, d]`,
        mask `[N, 1, 1, T]` or None -> `[N, T, d]`."""
        if rows is None:  # one pass (no loop: an exported graph keeps its batch dynamic)
            mean, std = self.transition(x, step, mask)
            return mean if draw is None else mean + std * draw
        total = x.shape[0]
        size = max(1, rows)
        pieces = []
        for start in range(0, total, size):
            end = min(total, start + size)
            part_mask = mask[start:end] if mask is not None else None
            mean, std = self.transition(x[start:end], step, part_mask)
            pieces.append(mean if draw is None else mean + std * draw[start:end])
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)

    def chunk_samples(self, batch: int, tokens: int) -> int:
        """Samples per pass: `sample_chunk` if set, else as many as keep one pass within
        `AUTO_CHUNK_TOKENS` tokens (sequences x length) and `AUTO_CHUNK_ROWS` sequences, at
        least 1, at most S."""
        from uqcompress.uq.noise import AUTO_CHUNK_ROWS, AUTO_CHUNK_TOKENS

        samples = self.spec.samples
        if self.sample_chunk is not None:
            return max(1, min(samples, self.sample_chunk))
        rows = min(AUTO_CHUNK_ROWS, AUTO_CHUNK_TOKENS // max(1, tokens))
        return max(1, min(samples, rows // max(1, batch)))

    def forward(self, noise: torch.Tensor | None = None, **inputs: Any) -> MemberOutput:
        inputs = {k: v for k, v in inputs.items() if k != "labels"}
        x0, mask = self.start_state(inputs)
        batch, length, hidden = x0.shape
        samples = self.spec.samples
        draws: torch.Tensor | torch.Generator | Callable[[], torch.Tensor]
        if noise is None and self.training:  # fresh draws for every training batch
            seed = int(torch.randint(1 << 62, ()).item())
            draws = torch.Generator(device=x0.device).manual_seed(seed)
        elif noise is None:  # per example (uq/noise.py), as the ONNX Predictor draws them
            draws = self._example_draws(inputs, x0)
        else:  # [B, S, K, T, d] -> [K, S*B, T, d], matching the folding below
            draws = noise.permute(2, 1, 0, 3, 4).reshape(
                self.steps, samples * batch, length, hidden
            )
        # Samples folded into the batch, sample-major: [S*B, T, d]; the transition and the
        # head run on chunks of samples ([c*B, ...] each) so memory stays bounded.
        rows = None if self.training or _tracing() else self.chunk_samples(batch, length) * batch
        x = x0.repeat(samples, 1, 1)
        folded_mask = mask.repeat(samples, 1, 1, 1) if mask is not None else None
        keep = inputs.get("attention_mask")  # [B, T] 1/0: only a last-token head reads it
        last_token = self.family.layout.pooled_token == "last"
        folded_keep = keep.repeat(samples, 1) if keep is not None and last_token else None
        x_k = self.rollout(x, folded_mask, draws, rows).to(self._head_dtype())  # [S*B, T, d]
        if rows is None:
            logits = self.head(x_k, folded_keep)  # [S*B, C]
        else:
            logits = torch.cat(
                [
                    self.head(
                        x_k[i : i + rows],
                        folded_keep[i : i + rows] if folded_keep is not None else None,
                    )
                    for i in range(0, x_k.shape[0], rows)
                ],
                dim=0,
            )  # [S*B, C]
        return MemberOutput(member_logits=logits.reshape(samples, batch, -1).transpose(0, 1))

    def _example_draws(
        self, inputs: dict[str, Any], x0: torch.Tensor
    ) -> Callable[[], torch.Tensor]:
        """Each step's draws, each example's from its own generator seeded by the model's seed
        and the example's content, so a prediction does not depend on its batch.

        Shape: each call -> `[S*B, T, d]` (sample-major, as the roll-out folds samples).
        """
        from uqcompress.uq.noise import ExampleNoise

        # As the Predictor holds them: int64 ids, float32 pixels.
        arrays = {
            name: (value.detach().float() if name == "pixel_values" else value.detach().long())
            .cpu()
            .numpy()
            for name, value in inputs.items()
            if name in NOISE_KEYS and value is not None
        }
        batch, length, hidden = x0.shape
        samples = self.spec.samples
        stream = ExampleNoise(arrays, self.spec.seed, samples, hidden, tokens=length)

        def next_step() -> torch.Tensor:
            draw = torch.from_numpy(stream.step()).to(device=x0.device, dtype=x0.dtype)
            return draw.transpose(0, 1).reshape(samples * batch, length, hidden)  # [S*B, T, d]

        return next_step


def _tracing() -> bool:
    """Inside an ONNX export or a trace: the graph takes all S samples in one pass (the
    Predictor feeds it chunks)."""
    return bool(
        torch.onnx.is_in_onnx_export() or torch.jit.is_tracing() or torch.compiler.is_compiling()
    )


def student_trainable(model: DirectorModel, train_head: bool) -> None:
    """The transition always trains; the embeddings and kept prefix never; the head by flag."""
    for param in model.parameters():
        param.requires_grad_(False)
    for param in model.transition.parameters():
        param.requires_grad_(True)
    if train_head:
        head_modules = [m for name, m in model.named_children() if name not in NEVER_HEAD]
        for module in head_modules:
            for param in module.parameters():
                param.requires_grad_(True)


def director_skeleton(config: Any, family: Family) -> DirectorModel:
    """A student with the shapes its config records (weights to be loaded)."""
    from uqcompress.models.surgery import classifier_skeleton

    spec = DirectorSpec.from_config(config)
    with torch.random.fork_rng(devices=[]):
        teacher = classifier_skeleton(config, family)  # a head-pruned teacher: its heads
        student = DirectorModel(teacher, family, spec)
    student_trainable(student, spec.train_head)
    student.config = config
    return student


def with_samples(model: DirectorModel, samples: int) -> None:
    """Change S for inference (`eval --samples`)."""
    from dataclasses import replace

    if samples < 1:
        raise ConfigError(f"--samples {samples} must be at least 1", hint="pass --samples 10")
    model.spec = replace(model.spec, samples=samples)


def _director_summary(loaded: Any) -> dict[str, Any]:
    return {"members": loaded.members, "method": "director", "samples": loaded.members}


DIRECTOR = ModelKind(
    name="director",
    key=DIRECTOR_KEY,
    described="a DIRECTOR student",
    noun="DIRECTOR model",
    remake="uqc distill-director",
    skeleton=director_skeleton,
    ensemble=True,
    refusal="{step} the teacher it was distilled from",
    summarise=_director_summary,
)
