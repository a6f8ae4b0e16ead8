#!/usr/bin/env bash
# Submit a stabledrl training job to a running Ray cluster through its job server.
#
#   deploy/submit.sh CONFIG [key.path=value ...]
#   RAY_ADDRESS=http://10.0.0.5:8265 deploy/submit.sh deploy/configs/llada8b_1node.yaml run.steps=50
#
# RAY_ADDRESS is the job server of the head (the dashboard port, default http://127.0.0.1:8265:
# reach a remote head through an SSH tunnel, `ssh -L 8265:127.0.0.1:8265 head`, rather than
# exposing its dashboard). With token authentication on (RAY_AUTH_MODE=token, see deploy/README.md)
# the client needs the cluster's token: RAY_AUTH_MODE=token plus RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH
# or ~/.ray/auth_token. The repository is uploaded as the job's working directory, so CONFIG is a
# path inside the repository; the cluster's Python must have stabledrl's dependencies installed.
# Extra `ray job submit` flags go in RAY_SUBMIT_FLAGS (e.g. "--no-wait").
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 CONFIG [key.path=value ...]" >&2
  exit 2
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CONFIG="$1"
shift
ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"
RAY="${RAY:-ray}"
# shellcheck disable=SC2086  # RAY_SUBMIT_FLAGS is a list of flags
exec "$RAY" job submit --address "$ADDRESS" --working-dir "$ROOT" ${RAY_SUBMIT_FLAGS:-} \
  --runtime-env-json '{"excludes": [".git", ".venv", "runs", ".cache", "**/__pycache__"]}' \
  -- python -m stabledrl train --config "$CONFIG" "$@"
