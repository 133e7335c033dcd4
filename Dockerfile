# One image for every part of the broker: web (gunicorn), worker and scheduler-worker (Celery), beat (Celery beat
# under a leader lock), migrate (a Job), and the node agent (python -m agent; --backend nvml on GPU nodes).
# The role is the first argument: docker run IMAGE web|agent-ingress|worker|scheduler-worker|beat|migrate|agent|manage ...
# Linted by hadolint in make test (tests/deploy/test_manifests.py); docs/operations.md "Kubernetes".
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GPUBROKER_VAR_DIR=/var/lib/gpubroker \
    PROMETHEUS_MULTIPROC_DIR=/tmp/gpubroker-metrics \
    LOG_FORMAT=json

# WeasyPrint (invoice PDFs) needs Pango; nothing else comes from the OS.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz0b fonts-dejavu-core \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 gpubroker \
    && useradd --system --uid 10001 --gid gpubroker --home-dir /app --shell /usr/sbin/nologin gpubroker

WORKDIR /app
COPY requirements.txt ./
RUN pip install -r requirements.txt
COPY . .
# static files are part of the image (WhiteNoise serves them); the settings need no database for this
RUN DJANGO_DEBUG=1 SECRET_KEY=build-only python manage.py collectstatic --noinput -v 0 \
    && chmod 0755 infra/docker/entrypoint.sh \
    && mkdir -p /var/lib/gpubroker "$PROMETHEUS_MULTIPROC_DIR" \
    && chown -R gpubroker:gpubroker /var/lib/gpubroker "$PROMETHEUS_MULTIPROC_DIR"

USER 10001
EXPOSE 8000 8001 9400 9808
ENTRYPOINT ["/app/infra/docker/entrypoint.sh"]
CMD ["web"]
