"""Seed the reference profiles and train the decision model once, so ``kind: auto`` can answer at once.

    python manage.py tiering_seed              # reference set (idempotent), then train unless a model exists
    python manage.py tiering_seed --retrain    # train again now (what the 6-hourly tiering.model_retrain does)
    python manage.py tiering_seed --background # seed, and let a Celery worker train (make run)

Without it a fresh deployment has no model until the periodic retrain (every 6 hours), and every ``kind: auto``
request answers 409 ``profile_first``. ``make run`` runs it with ``--background`` (docs/tiering.md, "A fresh
deployment: seed and train"): training on the reference set takes minutes on a small machine.
"""

from django.core.management.base import BaseCommand, CommandError

from tiering import services


class Command(BaseCommand):
    help = "Seed the tiering reference profiles (idempotent) and train the decision model once."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=120, help="reference workloads (default 120)")
        parser.add_argument("--seed", type=int, default=0, help="random seed of the reference set")
        parser.add_argument("--retrain", action="store_true", help="train even when a model exists")
        parser.add_argument("--background", action="store_true",
                            help="queue the training (Celery tiering.model_retrain) instead of training here: a "
                                 "worker trains it in a few minutes (make run: the banner need not wait for it)")

    def handle(self, *args, **opts):
        if not 1 <= opts["count"] <= 10_000:
            raise CommandError("--count must be 1 to 10000")
        created = services.reference_set_seed(count=opts["count"], seed=opts["seed"])
        self.stdout.write(f"reference set: {created} workload(s) created")
        current = services.model_current()
        if current is not None and not created and not opts["retrain"]:
            record = current[0]
            self.stdout.write(f"model {record.pk} kept (trained {record.trained_at:%Y-%m-%d %H:%M} UTC on "
                              f"{record.rows} rows); --retrain trains again")
            return
        if opts["background"]:
            from tiering.tasks import model_retrain

            model_retrain.delay()
            self.stdout.write("model: training queued (Celery tiering.model_retrain); kind: auto answers once it "
                              "is done")
            return
        record = services.model_retrain()
        if record is None:
            raise CommandError("too few profile rows to train a model")
        error = "n/a" if record.validation_error is None else f"{record.validation_error:.3f}"
        self.stdout.write(f"model {record.pk} trained on {record.rows} rows (validation error {error}, "
                          f"threshold {services.model_threshold(record):.2f})")
