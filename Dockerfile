# One image, every process: `docker run IMAGE web|worker|beat|migrate [ARGS]`
# (deploy/entrypoint.sh -> controlplane/process/entrypoint.py; docs/deploy.md).
# Pinned base (Python 3.11, as the lock was made with) and the product's dependencies
# only, each file checked against its hash (requirements-image.txt; the test toolchain
# stays in requirements.txt, for `make venv`); runs as an unprivileged user with
# production settings (DJANGO_DEBUG off unless asked; DJANGO_SECRET_KEY must be given at
# run time).
FROM python:3.11.7-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_DEBUG=0 \
    LOG_FORMAT=json \
    PORT=8000

RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --home-dir /app --no-create-home \
       --shell /usr/sbin/nologin app

WORKDIR /app
COPY requirements-image.txt ./
RUN pip install --no-deps --require-hashes -r requirements-image.txt && pip check

# The code, owned by root and read-only to the app user; it writes only under /tmp.
COPY manage.py pyproject.toml ./
COPY kernel/ kernel/
COPY controlplane/ controlplane/
COPY templates/ templates/
COPY static/ static/
COPY deploy/entrypoint.sh deploy/entrypoint.sh

USER app:app
EXPOSE 8000
ENTRYPOINT ["/app/deploy/entrypoint.sh"]
CMD ["web"]
