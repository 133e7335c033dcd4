#!/bin/sh
# The image's roles (Dockerfile). Every setting comes from the environment (.env.example, docs/operations.md).
set -eu

# prometheus_client's multi-process mode: one empty folder per container start
if [ -n "${PROMETHEUS_MULTIPROC_DIR:-}" ]; then
    mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
    find "$PROMETHEUS_MULTIPROC_DIR" -mindepth 1 -delete
fi

role="${1:-web}"
[ "$#" -gt 0 ] && shift

case "$role" in
    web)
        exec gunicorn config.wsgi --config python:config.gunicorn --bind "0.0.0.0:${PORT:-8000}" \
            --workers "${WEB_WORKERS:-2}" --worker-class gthread --threads "${WEB_THREADS:-4}" \
            --graceful-timeout 20 --access-logfile - "$@" ;;
    agent-ingress)
        # the node agents' own web server (config.agent_wsgi): enrollment, heartbeats, workload reports; the
        # usual heartbeat without Django's request cycle, never on the tenant API's workers
        exec gunicorn config.agent_wsgi --config python:config.gunicorn --bind "0.0.0.0:${AGENT_INGRESS_PORT:-8001}" \
            --workers "${AGENT_INGRESS_WORKERS:-1}" --worker-class gthread --threads "${AGENT_INGRESS_THREADS:-4}" \
            --graceful-timeout 20 "$@" ;;
    worker)
        # METRICS_PORT (default 9808): this worker's counters for Prometheus (no web process beside it)
        METRICS_PORT="${METRICS_PORT:-9808}" exec celery -A config worker --loglevel INFO \
            --concurrency "${WORKER_CONCURRENCY:-4}" --hostname "worker@${HOSTNAME:-%h}" "$@" ;;
    scheduler-worker)
        # schedule cycles only (CELERY_SCHEDULER_QUEUE): never queued behind agent calls
        METRICS_PORT="${METRICS_PORT:-9808}" exec celery -A config worker --loglevel INFO --concurrency 1 \
            --queues "${CELERY_SCHEDULER_QUEUE:-scheduler}" --hostname "scheduler@${HOSTNAME:-%h}" "$@" ;;
    notifications-worker)
        # webhook and e-mail deliveries only (CELERY_NOTIFICATIONS_QUEUE): a slow receiver never holds lease work
        METRICS_PORT="${METRICS_PORT:-9808}" exec celery -A config worker --loglevel INFO \
            --concurrency "${NOTIFICATIONS_CONCURRENCY:-4}" \
            --queues "${CELERY_NOTIFICATIONS_QUEUE:-notifications}" --hostname "notifications@${HOSTNAME:-%h}" "$@" ;;
    beat)
        # one beat among the replicas: the others wait for the lock (manage.py run_as_leader)
        exec python manage.py run_as_leader --lock beat -- \
            celery -A config beat --loglevel INFO --schedule /tmp/celerybeat-schedule "$@" ;;
    migrate)
        python manage.py migrate --noinput
        exec python manage.py createcachetable ;;
    agent)
        exec python -m agent "$@" ;;
    manage)
        exec python manage.py "$@" ;;
    *)
        exec "$role" "$@" ;;
esac
