"""GGUF checkpoints (llama.cpp's single-file format): read one into a float32 classifier.

A GGUF file holds a causal language model: its weights, stored as floats (F32, F16, BF16) or
in quantized blocks (Q8_0, Q4_K, ...), its config as metadata under llama.cpp's key names, and
its tokenizer as metadata (vocabulary, merges, special token ids). transformers reads all of it
(`from_pretrained(folder, gguf_file=name)`, which needs the `gguf` package): the weights are
dequantized and land in the family's sequence-classification class, whose head is new (the
file has none); the tokenizer is rebuilt from the metadata.

`describe_gguf` reads the header alone: it refuses a damaged file or an architecture uqc
cannot load before any weight is read, and says how the file was quantized (`Gguf.summary`).
`load_gguf` loads the model. Supported: the architectures transformers' GGUF loader and a uqc
family share, `llama` (Llama, and Mistral, which llama.cpp writes as `llama`), `qwen2` and
`qwen3`.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from uqcompress.errors import ArtifactError, ConfigError, DependencyError
from uqcompress.models.families import family_for_config
from uqcompress.models.loading import (
    LoadedModel,
    first_line,
    labels_of,
    quiet_transformers,
    settle_padding,
)

GGUF_SUFFIX = ".gguf"
GGUF_HINT = 'pip install "uqcompress[gguf]"'
# The general.architecture values uqc imports (each loads as the uqc family of that name).
# llama.cpp writes Mistral 7B and its derivatives as `llama`; a file that says `mistral3`,
# `phi3`, `gpt2`, ... is refused.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
_FLOAT_TYPES = ("F32", "F16", "BF16")


def find_gguf(source: Path) -> Path | None:
    """The GGUF file `source` names, or None when it is not a GGUF source.

    A path ending in `.gguf` (existing or not: `describe_gguf` reports a missing one), or a
    directory holding `.gguf` files and neither a config.json nor a uqc manifest (exactly one:
    a directory of several is refused, naming them)."""
    from uqcompress.artifacts import MANIFEST_NAME

    if source.suffix.lower() == GGUF_SUFFIX and not source.is_dir():
        return source
    if not source.is_dir() or (source / "config.json").exists():
        return None
    if (source / MANIFEST_NAME).exists():
        return None
    files = sorted(p for p in source.iterdir() if p.suffix.lower() == GGUF_SUFFIX and p.is_file())
    if len(files) > 1:
        names = ", ".join(p.name for p in files[:5]) + (", ..." if len(files) > 5 else "")
        raise ArtifactError(
            f"{source} holds {len(files)} GGUF files ({names}); uqc imports one",
            hint=f"pass the file itself: uqc import {files[0]}",
        )
    return files[0] if files else None


def require_gguf() -> ModuleType:
    """Import the `gguf` package (llama.cpp's reader, which transformers' loader needs too):
    it comes with the `gguf` extra, not the base install."""
    try:
        return importlib.import_module("gguf")
    except ImportError as exc:
        raise DependencyError(
            "reading GGUF files needs the gguf package, which is not installed (it comes with "
            "an extra, not the base package)",
            hint=GGUF_HINT,
        ) from exc


@dataclass(frozen=True)
class Gguf:
    """What a GGUF file's header says: its architecture and how its tensors are stored."""

    path: Path
    architecture: str  # general.architecture
    name: str | None  # general.name
    file_type: str | None  # general.file_type as llama.cpp names it: "Q4_K_M", "F16", ...
    tensor_types: dict[str, int] = field(default_factory=dict)  # ggml type -> tensor count
    metadata: dict[str, Any] = field(default_factory=dict, repr=False)  # scalar fields only

    @property
    def quantization(self) -> str:
        """The file's quantization: its declared file type, else the ggml types its tensors
        are stored in, joined by "+" ("F16+F32": half-precision matrices, float32 norms)."""
        return self.file_type or "+".join(sorted(self.tensor_types))

    @property
    def quantized(self) -> bool:
        """Whether any tensor is stored in quantized blocks rather than as floats."""
        return any(kind not in _FLOAT_TYPES for kind in self.tensor_types)

    def summary(self) -> dict[str, Any]:
        """The artifact summary's record of where the weights came from."""
        return {
            "source_format": "gguf",
            "gguf_architecture": self.architecture,
            "gguf_quantization": self.quantization,
            "gguf_tensor_types": dict(sorted(self.tensor_types.items())),
        }


def file_type_name(gguf: ModuleType, value: Any) -> str | None:
    """llama.cpp's name for a `general.file_type` value: 1 -> "F16", 15 -> "Q4_K_M"."""
    try:
        name = str(gguf.LlamaFileType(int(value)).name)
    except (ValueError, TypeError):
        return f"file type {value}"  # a newer llama.cpp's: keep the number
    if name == "GUESSED":
        return None
    return name.removeprefix("ALL_").removeprefix("MOSTLY_")


def describe_gguf(path: Path) -> Gguf:
    """Read the header of the GGUF file at `path` (no tensor data), refusing with one line a
    missing, damaged or truncated file, one of an unsupported architecture, and one without
    a tokenizer."""
    gguf = require_gguf()
    if not path.is_file():
        raise ArtifactError(
            f"{path} does not exist" + (" (it is a directory)" if path.is_dir() else ""),
            hint="check the path of the .gguf file",
        )
    try:
        reader = gguf.GGUFReader(str(path))
        metadata: dict[str, Any] = {}
        for key, entry in reader.fields.items():
            if not entry.types or entry.types[0] != gguf.GGUFValueType.ARRAY:
                metadata[key] = entry.contents()
        tensor_types = Counter(tensor.tensor_type.name for tensor in reader.tensors)
        has_tokens = "tokenizer.ggml.tokens" in reader.fields
    except Exception as exc:  # numpy/struct/ValueError on a damaged or truncated file
        raise ArtifactError(
            f"{path} is not a readable GGUF file, damaged or truncated ({first_line(exc)[:200]})",
            hint="download or convert the file again (llama.cpp's convert_hf_to_gguf.py)",
        ) from exc
    architecture = str(metadata.get("general.architecture", ""))
    supported = supported_architectures()
    if architecture not in supported:
        what = f"a {architecture!r} model" if architecture else "no general.architecture"
        raise ConfigError(
            f"{path} holds {what}; uqc imports GGUF files of the architectures "
            f"{', '.join(supported)} (Llama, Mistral, Qwen2/2.5, Qwen3)",
            hint="import a GGUF of a supported architecture, or the model's transformers "
            "directory (uqc import DIR)",
        )
    if not has_tokens:
        raise ArtifactError(
            f"{path} holds no tokenizer (no tokenizer.ggml.tokens in its metadata)",
            hint="convert the model again with its tokenizer (llama.cpp's convert_hf_to_gguf.py)",
        )
    file_type = metadata.get("general.file_type")
    name = metadata.get("general.name")
    return Gguf(
        path=path,
        architecture=architecture,
        name=str(name) if name is not None else None,
        file_type=file_type_name(gguf, file_type) if file_type is not None else None,
        tensor_types=dict(tensor_types),
        metadata=metadata,
    )


def supported_architectures() -> tuple[str, ...]:
    """The GGUF architectures both uqc and the installed transformers load."""
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:  # a transformers without the GGUF loader: every file is refused
        return ()
    return tuple(a for a in SUPPORTED_ARCHITECTURES if a in GGUF_SUPPORTED_ARCHITECTURES)


@contextmanager
def _no_conversion_bar() -> Iterator[None]:
    """transformers' GGUF loader draws its own tqdm bar ("Converting and de-quantizing GGUF
    tensors"), outside its logging switches; uqc prints its own progress, so it is silenced."""
    try:
        module: Any = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    except ImportError:
        yield
        return
    original = getattr(module, "tqdm", None)
    if original is None:
        yield
        return

    def passthrough(iterable: Any, *args: Any, **kwargs: Any) -> Any:
        return iterable

    module.tqdm = passthrough
    try:
        yield
    finally:
        module.tqdm = original


def _config(described: Gguf) -> Any:
    """The transformers config the file's metadata describes, with two repairs:

    - `qwen3`: transformers' mapping skips `attention.key_length`, so every Qwen3 file got
      Qwen3Config's default head_dim (128) whatever it holds; the file's value is used.
    - a `llama` file whose general.name is "mistral" is relabelled `mistral` by transformers,
      whose tensor-name map then has no entry for it; llama.cpp computes it as Llama, and so
      does uqc (LlamaConfig with the same values).
    """
    from transformers import AutoConfig, LlamaConfig

    path = described.path
    config: Any = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    key_length = described.metadata.get(f"{described.architecture}.attention.key_length")
    if key_length is not None and getattr(config, "head_dim", None) != int(key_length):
        config.head_dim = int(key_length)
    if described.architecture == "llama" and config.model_type != "llama":
        values = config.to_dict()
        for key in ("model_type", "architectures", "transformers_version", "sliding_window"):
            values.pop(key, None)
        config = LlamaConfig(**values)
    return config


def load_gguf(described: Gguf) -> LoadedModel:
    """The GGUF model `described` as the family's float32 sequence classifier, with the
    tokenizer its metadata describes. The classifier head is new (`new_head_keys`)."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    require_gguf()
    quiet_transformers()
    path = described.path
    hint = "convert the model again (llama.cpp's convert_hf_to_gguf.py), or import its "
    hint += "transformers directory"
    try:
        config = _config(described)
    except Exception as exc:  # metadata transformers cannot turn into a config
        raise ArtifactError(
            f"transformers cannot read the config in {path} ({first_line(exc)[:300]})", hint=hint
        ) from exc
    family = family_for_config(config, str(path))
    options: dict[str, Any] = {}
    gguf_config = getattr(transformers, "GgufConfig", None)
    if gguf_config is not None:  # a newer transformers would otherwise keep blocks packed
        options["quantization_config"] = gguf_config(dequantize=True)
    try:
        with _no_conversion_bar():
            loaded_with_info: Any = family.classifier_class().from_pretrained(
                str(path.parent),
                gguf_file=path.name,
                config=config,
                dtype=torch.float32,
                output_loading_info=True,
                **options,
            )
        model, info = loaded_with_info
    except Exception as exc:  # damaged tensor data, shapes that contradict the metadata, ...
        raise ArtifactError(
            f"cannot load the model in {path}: {first_line(exc)[:300]}", hint=hint
        ) from exc
    _drop_quantizer(model)
    model.eval()
    _refuse_incomplete(model, family.classifier_name(model), info, path)
    try:
        tokenizer: Any = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:  # a tokenizer type or layout transformers cannot rebuild
        raise ArtifactError(
            f"transformers cannot build the tokenizer in {path} ({first_line(exc)[:300]})",
            hint=hint,
        ) from exc
    tokenizer.model_max_length = int(config.max_position_embeddings)
    loaded = LoadedModel(
        model=model,
        family=family,
        config=model.config,
        labels=labels_of(model.config),
        tokenizer=tokenizer,
    )
    head = family.classifier_name(model)
    loaded.new_head_keys = sorted(k for k in info.get("missing_keys", []) if k.startswith(head))
    settle_padding(loaded, path)
    return loaded


def _drop_quantizer(model: Any) -> None:
    """Forget that the model came from a GGUF file: its weights are plain float32 tensors
    now, and transformers refuses to save a model that still carries its GGUF quantizer."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def _refuse_incomplete(model: Any, head: str, info: dict[str, Any], path: Path) -> None:
    """Every weight but the classifier head must come from the file, dequantized to float32:
    transformers would initialise a missing one at random, or keep packed blocks, silently."""
    import torch

    missing = sorted(k for k in info.get("missing_keys", []) if not k.startswith(head))
    if missing:
        shown = ", ".join(missing[:4]) + (
            f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        )
        raise ArtifactError(
            f"{path} has no tensors for {shown}",
            hint="convert the model again (llama.cpp's convert_hf_to_gguf.py): the file is "
            "incomplete or of another layout",
        )
    packed = sorted(n for n, p in model.named_parameters() if p.dtype != torch.float32)
    if packed:
        raise ArtifactError(
            f"transformers kept {packed[0]} of {path} as {model.get_parameter(packed[0]).dtype}, "
            "not dequantized to float32",
            hint="report this with your transformers version; import the model's transformers "
            "directory meanwhile",
        )
