# The trace context a task was created in (kernel.tracing): nullable, no default, so
# adding it rewrites no row.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('controlplane', '0013_api_token_audit'),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='trace',
            field=models.JSONField(null=True),
        ),
    ]
