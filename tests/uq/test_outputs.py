"""The one record of the contract's four outputs (uq/outputs.py), shared by every backend."""

from __future__ import annotations

import dataclasses

import numpy as np

from uqcompress.engine.sources import MemberOutputs, concat_rows
from uqcompress.export import contract
from uqcompress.export.runtime import Prediction
from uqcompress.uq.outputs import OUTPUT_FIELDS, ModelOutputs, concat_outputs, non_finite_rows


def _record(rows: int, seed: int) -> ModelOutputs:
    rng = np.random.default_rng(seed)
    return ModelOutputs(
        member_logits=rng.normal(size=(rows, 2, 3)).astype(np.float32),
        probs=rng.random((rows, 3)).astype(np.float32),
        entropy=rng.random(rows).astype(np.float32),
        mutual_info=rng.random(rows).astype(np.float32),
    )


def test_the_fields_are_the_contracts_outputs_in_its_order() -> None:
    assert tuple(contract.OUTPUT_NAMES) == ("member_logits", "probs", "entropy", "mutual_info")
    names = [f.name for f in dataclasses.fields(ModelOutputs)]
    assert tuple(names) == OUTPUT_FIELDS
    # both backends' records are this record with their own extra fields after the four
    for record in (Prediction, MemberOutputs):
        assert issubclass(record, ModelOutputs)
        assert tuple(f.name for f in dataclasses.fields(record))[:4] == OUTPUT_FIELDS


def test_concat_keeps_row_order_and_every_output() -> None:
    a, b = _record(2, 0), _record(3, 1)
    joined = ModelOutputs(**concat_outputs([a, b]))
    for name in OUTPUT_FIELDS:
        np.testing.assert_array_equal(getattr(joined, name)[:2], getattr(a, name))
        np.testing.assert_array_equal(getattr(joined, name)[2:], getattr(b, name))
    # the sources' concatenation adds their times on top of the same arrays
    timed = [MemberOutputs(**r.outputs(np.float64), seconds=s) for r, s in ((a, 1.0), (b, 2.5))]
    rows = concat_rows(timed)
    assert rows.seconds == 3.5
    np.testing.assert_array_equal(rows.member_logits, joined.member_logits)


def test_metrics_dtype_casts_all_but_the_member_logits() -> None:
    fields = _record(4, 2).outputs(np.float64)
    assert fields["member_logits"].dtype == np.float32
    assert {fields[n].dtype for n in OUTPUT_FIELDS[1:]} == {np.dtype(np.float64)}


def test_non_finite_rows_flags_the_examples_with_any_bad_output() -> None:
    record = _record(4, 3)
    record.member_logits[1, 1, 2] = np.nan
    record.mutual_info[3] = np.inf
    assert non_finite_rows(record).tolist() == [False, True, False, True]
