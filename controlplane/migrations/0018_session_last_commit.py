"""The time of a session's last commit, on the session: what dates it for retention
(``kernel.records.SessionRecord.last_commit_at``). A trim may remove the head commit's
row, which is all that dated a session before.

Existing sessions take their head commit's time. One whose head commit a trim already
removed takes the migration's time instead: its last commit is at least that old, so it
is pruned a retention period later than it could have been, never earlier.
"""

from django.db import migrations, models

FILL = """
UPDATE kernel_session s SET last_commit_at = coalesce(
    (SELECT c.at FROM kernel_commit c WHERE c.session_id = s.id AND c.seq = s.head_seq),
    now())
WHERE s.head_seq > 0
"""


class Migration(migrations.Migration):

    dependencies = [
        ("controlplane", "0017_fewer_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="session",
            name="last_commit_at",
            field=models.DateTimeField(null=True),
        ),
        migrations.RunSQL(FILL, migrations.RunSQL.noop),
    ]
