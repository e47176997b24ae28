#!/bin/sh
# The image's entry point: `entrypoint.sh web|worker|beat|migrate [ARGS...]`.
# The process's program replaces this shell (exec), so SIGTERM reaches it directly.
# PYTHON overrides the interpreter (the tests run this script with the project's venv).
set -eu
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" -m controlplane.process.entrypoint "$@"
