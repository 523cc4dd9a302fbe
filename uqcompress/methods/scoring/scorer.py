"""The `Scorer` record every scorer module declares, and what `uqc score` hands its function.

Torch-free: the registry imports every scorer module to read these records, and `uqc --help`
imports the registry (the choices and help text of `--method` come from it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from torch import Tensor

    from uqcompress.errors import Problems
    from uqcompress.models.loading import LoadedModel

Batch = Mapping[str, Any]
Progress = Callable[[int, int], None]  # (evaluations done, total)
Gather = Callable[["Tensor"], "Tensor"]  # [n_r, ...] per process -> [sum n_r, ...], rank order


class ScoreResult(NamedTuple):
    """What a scorer returns: its tensors (`"score"` `[L, H]` always; HIES adds `"his"` and
    `"ae"`), written to the scores artifact, and what it adds to the artifact's summary
    (a searched scorer: `kept_heads`, `keep_per_layer`, ...)."""

    tensors: dict[str, Tensor]
    summary: dict[str, Any]


@dataclass(frozen=True)
class ScoreRequest:
    """Everything a scorer may use, prepared by `steps/score.py` (which reads the data).

    Batches are built only when a scorer asks for them, so a data-free scorer reads none.
    """

    loaded: LoadedModel
    # The step's resolved config by field name: seed, calib_size, alpha, ratio, calib_pool, ...
    options: Mapping[str, Any]
    # The seeded `calib_size` subset of --data, encoded in fixed batches (in a multi-process
    # launch, this process's contiguous shard of them).
    calibration: Callable[[], Sequence[Batch]]
    # The examples `pick` (sorted indices into --data, a numpy array), encoded in fixed
    # batches; sharded across processes when the flag is true.
    encode: Callable[[Any, bool], Sequence[Batch]]
    examples: int  # how many examples --data has (0 without --data)
    # The OOD set's seeded `calib_size` subset, this process's shard; None without --ood.
    ood: Callable[[], Sequence[Batch]] | None
    gather: Gather | None  # combines the processes of a data-parallel run; None for one
    # A progress display for a long search: `with request.progress("label") as report:`.
    progress: Callable[[str], AbstractContextManager[Progress]]


@dataclass(frozen=True, eq=False)  # one record per scorer: compared and hashed by identity
class Scorer:
    """One head-importance method, as `uqc score --method NAME` runs it."""

    name: str  # the --method value
    score: Callable[[ScoreRequest], ScoreResult]
    about: str = ""  # said in brackets after the name in --method's help
    needs_data: bool = False  # scores on labelled calibration examples (--data)
    # Returns a searched set of kept heads for a head budget (--ratio, and --ood for its
    # uncertainty objective); prune keeps the set as searched instead of ranking scores.
    searched: bool = False
    aliases: tuple[str, ...] = ()  # old names still accepted, with a warning naming this one
    alias_note: str = ""  # said in brackets in that warning
    # Added to the artifact id: a changed definition is not served an earlier artifact.
    id_config: Mapping[str, str] = field(default_factory=dict)
    # Config fields only this scorer reads -> why: another --method refuses them.
    own_options: Mapping[str, str] = field(default_factory=dict)
    # The scorer's own checks of the config (`options` as in ScoreRequest), added to the
    # step's problems so every problem is reported at once.
    check: Callable[[Mapping[str, Any], Problems], None] | None = None

    def help(self) -> str:
        """How --method's help names it: `name` or `name (about)`."""
        return f"{self.name} ({self.about})" if self.about else self.name
