#!/usr/bin/env bash
# The shared MLflow tracking server (UI + REST API + artifact proxy), run from the project's .venv.
# See "Shared MLflow server" in slurm/README.md.
#
#   slurm/mlflow-server.sh                       # or `make mlflow-server`: http://127.0.0.1:5000
#   HOST=0.0.0.0 AUTH=basic MLFLOW_AUTH_ADMIN_PASSWORD=... slurm/mlflow-server.sh   # on a login node
#
# Environment (all optional):
#   HOST, PORT              bind address and port (127.0.0.1, 5000)
#   BACKEND_STORE_URI       runs, params, metrics (sqlite:///<repo>/mlflow.db); e.g.
#                           postgresql://user:password@dbhost:5432/mlflow
#   ARTIFACTS_DESTINATION   shared folder (or URI) the server stores artifacts in (<repo>/mlartifacts);
#                           clients upload and download through the server (--serve-artifacts)
#   WORKERS                 server worker processes (MLflow's default: 4)
#   AUTH=basic              MLflow's basic-auth app: every request needs a user name and password
#   AUTH_DIR                where the auth config and user database live
#                           (${XDG_STATE_HOME:-~/.local/state}/scalelab-mlflow); or set MLFLOW_AUTH_CONFIG_PATH
#   ALLOWED_HOSTS, CORS_ALLOWED_ORIGINS
#                           Host headers and browser origins accepted; derived from this machine's
#                           names and addresses when HOST is not loopback
#   ALLOW_NO_AUTH=1         allow a non-loopback HOST without AUTH=basic (anyone who can reach the
#                           port can then read and write every run)
# Further arguments are passed on to `mlflow server`.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MLFLOW="$REPO/.venv/bin/mlflow"
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-5000}"
BACKEND_STORE_URI="${BACKEND_STORE_URI:-sqlite:///$REPO/mlflow.db}"
ARTIFACTS_DESTINATION="${ARTIFACTS_DESTINATION:-$REPO/mlartifacts}"
AUTH="${AUTH:-}"

die() { echo "mlflow-server.sh: $*" >&2; exit 2; }

[ -x "$MLFLOW" ] || die "$MLFLOW not found: run \`make setup\` first"
# SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3; the lock file installs psycopg2.
case "$BACKEND_STORE_URI" in
  postgresql://*|postgres://*)
    if ! "$REPO/.venv/bin/python" -c "import psycopg" 2>/dev/null; then
      BACKEND_STORE_URI="postgresql+psycopg2://${BACKEND_STORE_URI#*://}"
    fi ;;
esac
case "$AUTH" in ""|basic) ;; *) die "AUTH=$AUTH is not allowed: use AUTH=basic or leave it unset" ;; esac

# The store URI goes in the environment, not the command line, where `ps` would show its password.
export MLFLOW_BACKEND_STORE_URI="$BACKEND_STORE_URI"
args=(server --serve-artifacts --artifacts-destination "$ARTIFACTS_DESTINATION" --host "$HOST" --port "$PORT")
[ -n "${WORKERS:-}" ] && args+=(--workers "$WORKERS")
case "$ARTIFACTS_DESTINATION" in *://*) ;; *) mkdir -p "$ARTIFACTS_DESTINATION" ;; esac

# This machine's names and IPv4 addresses: what compute nodes and browsers use to reach it.
own_names() {
  { echo localhost; echo 127.0.0.1; hostname -s 2>/dev/null; hostname -f 2>/dev/null
    hostname -I 2>/dev/null | tr ' ' '\n' | grep -v ':'
    case "$HOST" in 0.0.0.0|::) ;; *) echo "$HOST" ;; esac; } | grep -v '^$' | sort -u
}

case "$HOST" in
  127.*|localhost|::1) ;;
  *)
    if [ "$AUTH" != basic ] && [ "${ALLOW_NO_AUTH:-0}" != 1 ]; then
      die "HOST=$HOST exposes the server to the network without a password; set AUTH=basic" \
          "(see slurm/README.md) or ALLOW_NO_AUTH=1"
    fi
    # MLflow rejects Host headers it does not know (DNS rebinding) and state-changing browser
    # requests from other origins (CORS); by default it knows only localhost and private IPs.
    names="$(own_names)"
    ALLOWED_HOSTS="${ALLOWED_HOSTS:-$(for n in $names; do printf '%s,%s:%s,' "$n" "$n" "$PORT"; done | sed 's/,$//')}"
    CORS_ALLOWED_ORIGINS="${CORS_ALLOWED_ORIGINS:-$(for n in $names; do printf 'http://%s:%s,' "$n" "$PORT"; done | sed 's/,$//')}"
    ;;
esac
[ -n "${ALLOWED_HOSTS:-}" ] && args+=(--allowed-hosts "$ALLOWED_HOSTS")
[ -n "${CORS_ALLOWED_ORIGINS:-}" ] && args+=(--cors-allowed-origins "$CORS_ALLOWED_ORIGINS")

if [ "$AUTH" = basic ]; then
  "$REPO/.venv/bin/python" -c "import flask_wtf" 2>/dev/null \
    || die "AUTH=basic needs MLflow's auth extra (Flask-WTF): .venv/bin/pip install 'mlflow[auth]==$("$MLFLOW" --version | awk '{print $NF}')'"
  AUTH_DIR="${AUTH_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/scalelab-mlflow}"
  mkdir -p "$AUTH_DIR" && chmod 700 "$AUTH_DIR"
  if [ -z "${MLFLOW_AUTH_CONFIG_PATH:-}" ]; then
    export MLFLOW_AUTH_CONFIG_PATH="$AUTH_DIR/basic_auth.ini"
    # default_permission: what users get on experiments and runs that others created
    cat > "$MLFLOW_AUTH_CONFIG_PATH" <<EOF
[mlflow]
default_permission = ${AUTH_DEFAULT_PERMISSION:-READ}
database_uri = sqlite:///$AUTH_DIR/basic_auth.db
admin_username = ${MLFLOW_AUTH_ADMIN_USERNAME:-admin}
EOF
    if [ ! -f "$AUTH_DIR/basic_auth.db" ] && [ -z "${MLFLOW_AUTH_ADMIN_PASSWORD:-}" ]; then
      die "AUTH=basic: the first start needs MLFLOW_AUTH_ADMIN_PASSWORD (the admin user's password)"
    fi
  fi
  # The CSRF secret must be the same in every worker and across restarts: kept in AUTH_DIR.
  [ -s "$AUTH_DIR/secret_key" ] || (umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$AUTH_DIR/secret_key")
  export MLFLOW_FLASK_SERVER_SECRET_KEY="${MLFLOW_FLASK_SERVER_SECRET_KEY:-$(cat "$AUTH_DIR/secret_key")}"
  args+=(--app-name basic-auth)
fi

# Never echo a database password.
shown_backend="$(printf '%s' "$BACKEND_STORE_URI" | sed -E 's#(://[^:/@]+):[^@]*@#\1:***@#')"
echo "mlflow-server.sh: http://$HOST:$PORT  backend=$shown_backend  artifacts=$ARTIFACTS_DESTINATION${AUTH:+  auth=$AUTH}" >&2
exec "$MLFLOW" "${args[@]}" "$@"
