"""What a bulk action's preview found of each task (its updated_seq for a retry, its run
for a cancel): each task is acted on only as it was then. Existing rows name nothing."""

import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('controlplane', '0019_what_operators_saw'),
    ]

    operations = [
        migrations.AddField(
            model_name='bulkaction',
            name='seen',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.BigIntegerField(), null=True, size=None),
        ),
    ]
