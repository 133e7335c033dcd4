"""A node's workload runtime and isolation as its agent reports them (agent.isolation; issue 28)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('broker', '0013_wave9_share_enforcement'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='isolation',
            field=models.CharField(blank=True, choices=[
                ('', 'Not reported'), ('uid', 'Own user, cgroup and view per tenant'),
                ('none', "As the agent's own user (no isolation)"), ('container', 'Containers')],
                db_default='', default='', max_length=16),
        ),
        migrations.AddField(
            model_name='node',
            name='workload_runtime',
            field=models.CharField(blank=True, db_default='', default='', max_length=16),
        ),
    ]
