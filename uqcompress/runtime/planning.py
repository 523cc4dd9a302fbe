"""Planning mode (`uqc run --dry-run`): steps check their inputs and compute their artifact
id as usual, then stop where they would start work, saying where the artifact would go and
whether it is already there. Nothing is built, written or downloaded."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

_PLANNING: ContextVar[bool] = ContextVar("uqc_planning", default=False)


class PlannedStep(Exception):
    """Raised instead of building while `planning()` is on."""

    def __init__(
        self,
        dest: Path,
        reusable: bool,
        kind: str,
        artifact_id: str,
        config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(str(dest))
        self.dest, self.reusable, self.kind, self.id = dest, reusable, kind, artifact_id
        # the config the artifact would record: what the step itself resolved (--dtype auto,
        # a default that depends on the model) over the options as given
        self.config = config


class PlannedPrediction(Exception):
    """Raised by predict instead of predicting while `planning()` is on: its model and data
    were checked, and `examples` records would be written."""

    def __init__(self, examples: int) -> None:
        super().__init__(f"{examples} examples")
        self.examples = examples


@contextmanager
def planning() -> Iterator[None]:
    token = _PLANNING.set(True)
    try:
        yield
    finally:
        _PLANNING.reset(token)


def is_planning() -> bool:
    return _PLANNING.get()
