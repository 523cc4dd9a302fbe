"""Optional dependencies fail with one line naming the extra."""

from __future__ import annotations

import sys

import pytest

from uqcompress.errors import DependencyError
from uqcompress.runtime.deps import require_onnxruntime


def test_onnxruntime_is_found_when_installed() -> None:
    module = require_onnxruntime()
    assert hasattr(module, "InferenceSession")


def test_missing_onnxruntime_names_the_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` fail
    with pytest.raises(DependencyError) as info:
        require_onnxruntime()
    assert info.value.hint is not None
    assert "uqcompress[cpu]" in info.value.hint and "uqcompress[gpu]" in info.value.hint
    assert "\n" not in info.value.message
