import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('controlplane', '0014_task_trace'),
    ]

    operations = [
        migrations.AlterField(
            model_name='entry',
            name='conversation',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                    to='controlplane.conversation'),
        ),
        migrations.AddIndex(
            model_name='entry',
            index=models.Index(
                condition=models.Q(kind='summary'),
                fields=['conversation', 'seq', 'ordinal'],
                name='kernel_entry_summaries',
            ),
        ),
    ]
