"""The one schema: kernel records and Django models correspond by name, and map both ways."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime

import pytest
from psycopg.types.json import Jsonb

from controlplane import models
from controlplane.storage import schema
from kernel.records import Status, Submission, SubmissionStatus, Task


def a_task(**changes: object) -> Task:
    task = Task(
        id="t_1",
        session_id="s_1",
        kind="demo.step",
        version=2,
        input={"n": 1},
        status=Status.WAITING,
        phase="a",
        checkpoint={"step": 3},
        created_seq=1,
        updated_seq=4,
        wait={"deps": ["t_0"]},
        lease_until=datetime(2026, 1, 1, tzinfo=UTC),
    )
    return dataclasses.replace(task, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize("table", schema.TABLES, ids=lambda t: t.name)
def test_every_record_corresponds_to_its_model(table: schema.Table) -> None:
    assert schema.mismatches(table.record_type, table.model) == []
    model_columns = {f.attname for f in table.model._meta.concrete_fields}
    assert set(table.columns) <= model_columns
    assert set(table.inserted) <= model_columns


def test_a_mismatch_is_named() -> None:
    @dataclasses.dataclass(frozen=True)
    class Noted:
        id: str
        not_a_column: str

    with pytest.raises(schema.SchemaMismatch) as raised:
        schema.Table(Noted, models.Task)
    message = str(raised.value)
    assert "'not_a_column'" in message and "has no model column" in message
    assert "'session_id'" in message and "not a field of the record" in message


def test_task_row_is_by_name_with_conversions_chosen_by_type() -> None:
    task = a_task()
    row = schema.TASK.row(task)
    assert row["status"] == "waiting" and type(row["status"]) is str
    assert isinstance(row["input"], Jsonb) and row["input"].obj == {"n": 1}
    assert row["cancel"] is None  # nullable JSON: SQL NULL, not JSON null
    assert row["wait_deps"] == ["t_0"]  # a property of the record, written, never read
    assert "wait_deps" not in schema.TASK.columns
    assert row["lease_until"] == task.lease_until


def test_records_from_orm_values_and_from_sql_rows() -> None:
    task = a_task(outcome={"kind": "succeeded"})
    orm = {c: getattr(task, c) for c in schema.TASK.columns}  # .values(): JSON decoded
    orm["status"] = "waiting"
    assert schema.TASK.record(orm) == task
    sql = [orm[c] for c in schema.TASK.columns]  # a cursor: jsonb arrives as text
    for name in ("input", "checkpoint", "wait", "signals", "outcome"):
        sql[schema.TASK.columns.index(name)] = json.dumps(orm[name])
    restored = schema.TASK.from_sql(sql)
    assert restored == task and restored.status is Status.WAITING


def test_update_writes_all_but_the_fixed_columns_then_the_key() -> None:
    submission = Submission("u_1", "s_1", "c_1", "r_1", {}, SubmissionStatus.PLACED, 1, 2)
    assert schema.SUBMISSION.updated == ("status", "updated_seq", "answer_entry_id", "reason",
                                         "resubmits")
    assert schema.SUBMISSION.update_values(submission) == ["placed", 2, None, None, 0, "u_1"]
    assert "kind" not in schema.TASK.updated and "lease_until" in schema.TASK.updated
