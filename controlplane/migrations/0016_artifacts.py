from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('controlplane', '0015_summary_index'),
    ]

    operations = [
        migrations.CreateModel(
            name='Artifact',
            fields=[
                ('digest', models.TextField(primary_key=True, serialize=False)),
                ('data', models.BinaryField()),
                ('media_type', models.TextField()),
                ('size', models.BigIntegerField()),
                ('created_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'kernel_artifact',
            },
        ),
    ]
