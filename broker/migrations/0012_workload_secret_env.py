"""A workload's secret_env, sealed (issue 27, item 1): the column, and the secrets that earlier workloads held in
their visible ``env`` (the profiler's PERF_TOKEN, names such as HF_TOKEN or DB_PASSWORD: ``agent.protocol.
env_name_looks_secret``) moved out of the spec into it, so no answer shows them from now on."""

from django.db import migrations, models


def seal_secret_looking_env(apps, schema_editor):
    from agent.protocol import env_name_looks_secret
    from broker.workload_secrets import secret_env_open, secret_env_seal

    Workload = apps.get_model("broker", "Workload")
    for workload in Workload.objects.filter(spec__has_key="env").iterator():
        env = workload.spec.get("env") or {}
        moved = {name: value for name, value in env.items() if env_name_looks_secret(name)}
        if not moved:
            continue
        secrets = {**secret_env_open(workload.secret_env_sealed), **moved}
        spec = {**workload.spec, "env": {name: value for name, value in env.items() if name not in moved},
                "secret_env": sorted(secrets)}
        Workload.objects.filter(pk=workload.pk).update(spec=spec, secret_env_sealed=secret_env_seal(secrets))


class Migration(migrations.Migration):

    dependencies = [
        ("broker", "0011_snapshot_change_log"),
    ]

    operations = [
        migrations.AddField(
            model_name="workload",
            name="secret_env_sealed",
            field=models.TextField(blank=True, db_default="", default=""),
        ),
        migrations.RunPython(seal_secret_looking_env, migrations.RunPython.noop, elidable=True),
    ]
