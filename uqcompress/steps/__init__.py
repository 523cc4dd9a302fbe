"""One module per CLI step: a config dataclass and `run(...) -> StepResult`.

Steps are the artifact adapters: open inputs, check kinds, call models/methods, write the
artifact. They print nothing to stdout (the CLI does) and raise UqcError for user mistakes.
"""
