#!/usr/bin/env bash
# Start the whole platform on one machine (`make run`): prepare, then hand over to honcho,
# which runs platform/Procfile and stops every process on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
# The data directory holds the database, sessions and the secret key: this user's alone.
umask 077
export PATH="$PWD/.venv/bin:$PATH"
export PLATFORM_DATA_DIR="${PLATFORM_DATA_DIR:-$PWD/var}"
mkdir -p "$PLATFORM_DATA_DIR"

# export_secret NAME FILE BYTES: the variable NAME, unless set, from FILE in the data directory,
# written once with a random secret of BYTES bytes.
export_secret() {
  local file="$PLATFORM_DATA_DIR/$2" value
  if [ -n "${!1:-}" ]; then
    return
  fi
  if [ ! -s "$file" ]; then
    (umask 077; python -c "import secrets; print(secrets.token_urlsafe($3))" > "$file")
  fi
  value="$(cat "$file")"
  export "$1=$value"
}

# A secret of this installation, generated once and kept in the data directory.
export_secret SECRET_KEY secret_key 50
# The serving hosts' management secret, shared by the console and the serving host.
export_secret SERVING_SECRET serving_secret 32
export SERVING_PORT="${SERVING_PORT:-8300}"

processes=(web worker train beat serve)
if [ -z "${REDIS_URL:-}" ]; then
  export PLATFORM_REDIS_PORT="${PLATFORM_REDIS_PORT:-6380}"
  export REDIS_URL="redis://127.0.0.1:$PLATFORM_REDIS_PORT/0"
  processes=(redis "${processes[@]}")
fi

if [ -z "${LABEL_STUDIO_URL:-}" ]; then
  export LABEL_STUDIO_PORT="${LABEL_STUDIO_PORT:-8090}"
  export LABEL_STUDIO_URL="http://127.0.0.1:$LABEL_STUDIO_PORT"
  export LABEL_STUDIO_TOKEN_FILE="${LABEL_STUDIO_TOKEN_FILE:-$PLATFORM_DATA_DIR/label-studio/platform-token}"
  processes+=(labelstudio)
fi

python manage.py migrate --noinput
python manage.py collectstatic --noinput --verbosity 0
python manage.py platform_bootstrap --url "http://${PLATFORM_WEB_HOST:-127.0.0.1}:${PLATFORM_WEB_PORT:-8000}/"
echo "  Redis          : $REDIS_URL"
echo "  Label Studio   : $LABEL_STUDIO_URL"
echo "  推理 Serving   : http://127.0.0.1:$SERVING_PORT (the endpoints' inference API)"
echo "  数据 Data      : $PLATFORM_DATA_DIR"
echo "  Ctrl-C stops every process."
echo
exec honcho --procfile platform/Procfile --app-root . start "${processes[@]}"
