"""Fewer indexes for every commit to keep up: each row a commit inserts updates every
index of its table.

- A foreign key's own index goes where an index or unique constraint already leads with
  its column (the session of a document, a task or a submission; the document of a
  version).
- Every ``*_like`` index of a ``kernel_*`` table goes. Django adds one
  (``text_pattern_ops``) beside each index of a text column, for ``LIKE 'prefix%'``;
  nothing filters ids by a prefix (the tasks page's id search is ``ILIKE '%...%'``,
  which such an index cannot serve). Django does not track these indexes, so a later
  ``AlterField`` of such a column would make them again: ``tests/integration/
  test_indexes.py`` says so.
"""

import django.db.models.deletion
from django.db import migrations, models


DROP_LIKE_INDEXES = """
DO $$
DECLARE found record;
BEGIN
    FOR found IN
        SELECT indexname FROM pg_indexes
        WHERE schemaname = current_schema() AND tablename LIKE 'kernel\\_%'
          AND indexname LIKE '%\\_like' AND indexdef LIKE '%text_pattern_ops%'
    LOOP
        EXECUTE format('DROP INDEX %I', found.indexname);
    END LOOP;
END $$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('controlplane', '0016_artifacts'),
    ]

    operations = [
        migrations.AlterField(
            model_name='document',
            name='session',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, to='controlplane.session'),
        ),
        migrations.AlterField(
            model_name='documentversion',
            name='document',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, to='controlplane.document'),
        ),
        migrations.AlterField(
            model_name='submission',
            name='session',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, to='controlplane.session'),
        ),
        migrations.AlterField(
            model_name='task',
            name='session',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, to='controlplane.session'),
        ),
        migrations.RunSQL(DROP_LIKE_INDEXES, migrations.RunSQL.noop),
    ]
