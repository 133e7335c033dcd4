from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0011_wave12_ssh_keys'),
    ]

    operations = [
        migrations.AddField(
            model_name='project',
            name='idle_suspend_opt_out',
            field=models.BooleanField(db_default=False, default=False),
        ),
    ]
