"""The error tree every user-facing failure goes through.

Library code raises these; only ``cli/app.py`` turns them into a one-line message plus hint.
A message states what was expected, what was found and names the artifact, file or layer;
``hint`` names the flag or command that fixes it. Anything else that escapes is a bug.
"""

from __future__ import annotations


class UqcError(Exception):
    """Base class: a user-facing problem with a one-line message and a fix."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class ConfigError(UqcError):
    """A flag value or configuration that cannot work (bad ratio, unknown preset, ...)."""


class ArtifactError(UqcError):
    """A path that is not the artifact a step expects (missing, wrong kind, occupied --out)."""


class IntegrityError(ArtifactError):
    """An artifact whose files do not match their recorded hashes, or that escapes its directory."""


class SchemaError(ArtifactError):
    """A manifest this version cannot read (newer kind_version, malformed JSON, missing keys)."""


class IncompatibleInputError(UqcError):
    """Inputs that cannot be combined (ensemble members with different labels, ...)."""


class DataError(UqcError):
    """A data spec, file, column or label that cannot be used."""


class NonFiniteError(UqcError):
    """A model whose outputs (logits, probabilities, head scores) or weights are NaN or
    infinite: nothing measured from them can be trusted, so nothing is written."""


def empty_text_error(where: str) -> DataError:
    """The one error for a text input with no real token, raised by every path that encodes
    text (torch `data.encoding.encode`, the ONNX `Predictor`): the model would read only
    padding or special tokens there, and what a fused Hydra or a decoder's last-token head
    returns for that is not defined, so uqc refuses it rather than inventing an output."""
    return DataError(
        f"{where} has no real token (empty, whitespace or only special tokens)",
        hint="fill in or drop the rows whose text is empty",
    )


class DependencyError(UqcError):
    """An optional dependency (ONNX Runtime extra, ...) that is not installed."""


class ParityError(UqcError):
    """An exported model that disagrees with PyTorch beyond tolerance."""

    exit_code = 3


class QualityGateError(UqcError):
    """A quality gate that failed; the artifact was still written."""

    exit_code = 3


class ConfigProblems(ConfigError):
    """Every problem of one step's options at once: a user fixes them in one round. One problem
    reads exactly as that problem's own error; several are listed one per line, each with its
    fix, the way a recipe's problems are."""

    def __init__(self, problems: list[ConfigError]) -> None:
        first = problems[0]
        if len(problems) == 1:
            super().__init__(first.message, first.hint)
        else:
            lines = [f"  {p.message}" + (f" (fix: {p.hint})" if p.hint else "") for p in problems]
            # Each line carries its own fix: a closing "(fix: fix the options above)" would
            # only repeat them.
            super().__init__(f"{len(problems)} problems with the options:\n" + "\n".join(lines))
        self.problems = problems


class Problems:
    """Collects ConfigErrors; `raise_any()` raises them together as one ConfigProblems."""

    def __init__(self) -> None:
        self.errors: list[ConfigError] = []

    def add(self, message: str, hint: str | None = None) -> None:
        self._keep(ConfigError(message, hint))

    def _keep(self, error: ConfigError) -> None:
        """Keep `error` unless the same problem is already said: a step config and the
        training engine both check the shared bounds (runtime/limits), and a user is told each
        problem once."""
        if all(str(kept) != str(error) for kept in self.errors):
            self.errors.append(error)

    def check(self, validate: object) -> None:
        """Run a callable that raises ConfigError (or ConfigProblems); keep what it raised."""
        assert callable(validate)
        try:
            validate()
        except ConfigProblems as exc:
            for problem in exc.problems:
                self._keep(problem)
        except ConfigError as exc:
            self._keep(exc)

    def raise_any(self) -> None:
        if self.errors:
            raise ConfigProblems(self.errors)
