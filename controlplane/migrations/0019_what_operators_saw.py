"""What an operator's actions name as what the operator saw: a task's run (one more at
each retry and restart from a phase: a cancel names it) and a submission's count of
resubmissions (each changes its seq: a resubmission names it). Existing rows start at 0:
a value only has to change from the one an operator saw."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('controlplane', '0018_session_last_commit'),
    ]

    operations = [
        migrations.AddField(
            model_name='submission',
            name='resubmits',
            field=models.IntegerField(default=0),
        ),
        migrations.AddField(
            model_name='task',
            name='run',
            field=models.IntegerField(default=0),
        ),
    ]
