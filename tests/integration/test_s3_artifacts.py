"""Artifacts in an S3-compatible store, against a real SeaweedFS server the test starts
(not a mock): stored whole once, read with the hash checked, a damaged object refused
with a clear error, old unreferenced objects swept; and the agent loop storing a large
tool result there, the model getting the reference."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controlplane.storage.s3_artifacts import S3Artifacts
from kernel import ManualClock, Scheduler
from kernel.artifacts import REFERENCE, CorruptArtifact, MissingArtifact, load, offload
from tests.seaweedfs import seaweedfs
from tests.unit.report_agent import REPORT, ask, result_of, world

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Artifacts]:
    directory: Path = tmp_path_factory.mktemp("s3")
    with pytest.MonkeyPatch.context() as patch, seaweedfs(directory) as endpoint:
        patch.setenv("AWS_ACCESS_KEY_ID", "test")  # SeaweedFS with no identities: any
        patch.setenv("AWS_SECRET_ACCESS_KEY", "test")
        found = S3Artifacts.connect(endpoint, "artifacts")
        found.ensure_bucket()
        yield found


def test_an_artifact_round_trips_once_and_a_damaged_object_is_refused(
    store: S3Artifacts,
) -> None:
    reference = offload(store, REPORT, 4_096)
    assert load(store, reference) == REPORT
    assert store.media_type(reference[REFERENCE]) == "application/json"
    assert offload(store, REPORT, 4_096)[REFERENCE] == reference[REFERENCE]
    listed = store.client.list_objects_v2(Bucket=store.bucket, Prefix=store.prefix)
    assert [o["Key"] for o in listed["Contents"]].count(store.key(reference[REFERENCE])) == 1
    # Damage the object behind the store's back.
    store.client.put_object(Bucket=store.bucket, Key=store.key(reference[REFERENCE]),
                            Body=b'{"rows": []}')
    with pytest.raises(CorruptArtifact, match=f"artifact {reference[REFERENCE]} is corrupt"):
        load(store, reference)
    offload(store, REPORT, 4_096)  # stored again: whole
    assert load(store, reference) == REPORT
    with pytest.raises(MissingArtifact):
        store.get("sha256:" + "3" * 64)


def test_the_sweep_removes_old_unreferenced_objects_only(store: S3Artifacts) -> None:
    kept = store.put(b"referenced by a record", "text/plain")
    orphan = store.put(b"left by a dead writer", "text/plain")
    now = datetime.now(UTC)

    def referenced(digests: object) -> set[str]:
        return {kept}

    assert store.sweep(referenced, now) == 0  # all younger than the grace period
    listed = store.client.list_objects_v2(Bucket=store.bucket, Prefix=store.prefix)
    stored = len(listed["Contents"])  # with what the other tests left, unreferenced here
    assert store.sweep(referenced, now + timedelta(hours=2)) == stored - 1
    with pytest.raises(MissingArtifact):
        store.get(orphan)
    assert store.get(kept) == b"referenced by a record"


def test_the_agent_loop_stores_a_large_result_there(store: S3Artifacts) -> None:
    clock = ManualClock()
    kernel, provider = world(store, clock)
    handle, conversation = ask(kernel)
    Scheduler(kernel, "w").run_until_idle()
    reference = result_of(kernel, conversation)
    assert load(store, reference) == REPORT
    told = [m for m in provider.requests[-1].messages if m["role"] == "tool"][-1]
    assert told["content"]["result"][REFERENCE] == reference[REFERENCE]
