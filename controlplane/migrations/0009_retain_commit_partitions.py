"""The commit log partitioned by time, and each session's retention marker.

``kernel_commit`` becomes a table partitioned by range of ``at`` (its rows kept): a new
partitioned table takes the rows, the old table goes, and the new one takes its name,
its constraints' names and its id sequence's position. Postgres before 17 has no
identity column on a partitioned table, so ``id`` draws from a plain sequence owned by
the column. Every unique constraint ends with ``at``, the partition key (see
``controlplane.models.Commit``). The rows land in the default partition first, then
:func:`controlplane.storage.partitions.ensure` moves them into one partition per
period and makes the partitions ahead.
"""

from django.conf import settings
from django.db import migrations, models
from django.utils import timezone

FORWARD = """
CREATE TABLE kernel_commit_partitioned (
    id bigint NOT NULL,
    seq bigint NOT NULL,
    at timestamp with time zone NOT NULL,
    actor text NOT NULL,
    summary jsonb NOT NULL,
    session_id text NOT NULL,
    key text
) PARTITION BY RANGE (at);
CREATE TABLE kernel_commit_default PARTITION OF kernel_commit_partitioned DEFAULT;
INSERT INTO kernel_commit_partitioned (id, seq, at, actor, summary, session_id, key)
    SELECT id, seq, at, actor, summary, session_id, key FROM kernel_commit;
CREATE SEQUENCE kernel_commit_ids;
SELECT setval('kernel_commit_ids', last_value, is_called) FROM kernel_commit_id_seq;
DROP TABLE kernel_commit;
ALTER TABLE kernel_commit_partitioned RENAME TO kernel_commit;
ALTER SEQUENCE kernel_commit_ids RENAME TO kernel_commit_id_seq;
ALTER SEQUENCE kernel_commit_id_seq OWNED BY kernel_commit.id;
ALTER TABLE kernel_commit ALTER COLUMN id SET DEFAULT nextval('kernel_commit_id_seq');
ALTER TABLE kernel_commit ADD CONSTRAINT kernel_commit_pkey PRIMARY KEY (id, at);
ALTER TABLE kernel_commit ADD CONSTRAINT commit_seq_once UNIQUE (session_id, seq, at);
CREATE UNIQUE INDEX commit_key_once ON kernel_commit (session_id, key, at)
    WHERE key IS NOT NULL;
CREATE INDEX commit_at_brin ON kernel_commit USING brin (at);
ALTER TABLE kernel_commit ADD CONSTRAINT kernel_commit_session_id_4cc108de_fk_kernel_session_id
    FOREIGN KEY (session_id) REFERENCES kernel_session (id) DEFERRABLE INITIALLY DEFERRED;
"""

BACKWARD = """
CREATE TABLE kernel_commit_plain (LIKE kernel_commit INCLUDING DEFAULTS);
INSERT INTO kernel_commit_plain SELECT * FROM kernel_commit;
ALTER SEQUENCE kernel_commit_id_seq OWNED BY NONE;
DROP TABLE kernel_commit;
ALTER TABLE kernel_commit_plain RENAME TO kernel_commit;
ALTER SEQUENCE kernel_commit_id_seq OWNED BY kernel_commit.id;
ALTER TABLE kernel_commit ADD CONSTRAINT kernel_commit_pkey PRIMARY KEY (id);
ALTER TABLE kernel_commit ADD CONSTRAINT commit_seq_once UNIQUE (session_id, seq);
CREATE UNIQUE INDEX commit_key_once ON kernel_commit (session_id, key) WHERE key IS NOT NULL;
CREATE INDEX commit_at_brin ON kernel_commit USING brin (at);
CREATE INDEX kernel_commit_session_id_4cc108de ON kernel_commit (session_id);
ALTER TABLE kernel_commit ADD CONSTRAINT kernel_commit_session_id_4cc108de_fk_kernel_session_id
    FOREIGN KEY (session_id) REFERENCES kernel_session (id) DEFERRABLE INITIALLY DEFERRED;
"""


def make_partitions(apps, schema_editor):
    from controlplane.storage import partitions

    with schema_editor.connection.cursor() as cur:
        partitions.ensure(
            cur,
            timezone.now(),
            settings.KERNEL_COMMIT_PARTITION,
            settings.KERNEL_COMMIT_PARTITIONS_AHEAD,
        )


class Migration(migrations.Migration):

    dependencies = [
        ("controlplane", "0008_task_waiting_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="session",
            name="pruned_seq",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(FORWARD, BACKWARD),
                migrations.RunPython(make_partitions, migrations.RunPython.noop),
            ],
            state_operations=[
                migrations.RemoveConstraint(model_name="commit", name="commit_seq_once"),
                migrations.RemoveConstraint(model_name="commit", name="commit_key_once"),
                migrations.AlterField(
                    model_name="commit",
                    name="session",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        to="controlplane.session",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="commit",
                    constraint=models.UniqueConstraint(
                        fields=("session", "seq", "at"), name="commit_seq_once"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="commit",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(("key__isnull", False)),
                        fields=("session", "key", "at"),
                        name="commit_key_once",
                    ),
                ),
            ],
        ),
    ]
