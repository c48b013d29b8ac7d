#!/usr/bin/env bash
# The shared MLflow tracking server (UI + REST API + artifact proxy), run from the project's .venv.
# See "Shared MLflow server" in slurm/README.md.
#
#   MLFLOW_AUTH_ADMIN_PASSWORD=... slurm/mlflow-server.sh     # or `make mlflow-server`: http://127.0.0.1:5000
#   HOST=0.0.0.0 MLFLOW_AUTH_ADMIN_PASSWORD=... slurm/mlflow-server.sh      # on a login node
#   ALLOW_NO_AUTH=1 slurm/mlflow-server.sh        # one user on one machine: no password
#
# Artifacts (profiler traces, plots, configs) go to the lab's store when this clone has one (DVC's
# default remote, `scalelab store set`): <store>/mlflow-artifacts, an S3 prefix or a folder.
#
# Environment (all optional):
#   HOST, PORT              bind address and port (127.0.0.1, 5000)
#   BACKEND_STORE_URI       runs, params, metrics (sqlite:///<repo>/mlflow.db); e.g.
#                           postgresql://user:password@dbhost:5432/mlflow
#   ARTIFACTS_DESTINATION   shared folder (or URI) the server stores artifacts in: by default the
#                           store's mlflow-artifacts (the store's endpoint and credentials are passed
#                           to the server in its environment, never on its command line), else
#                           <repo>/mlartifacts; clients upload and download through the server
#                           (--serve-artifacts) and need no store credentials
#   WORKERS                 server worker processes (MLflow's default: 4)
#   AUTH=basic              MLflow's basic-auth app: every request needs a user name and password
#                           (the default on every bind, loopback included, unless ALLOW_NO_AUTH=1)
#   MLFLOW_AUTH_ADMIN_PASSWORD
#                           with auth, needed on every start: the admin user's password (12 or
#                           more characters, never MLflow's old default password1234). The first
#                           start creates the admin user with it; every later start checks it and
#                           refuses to start on a mismatch.
#   AUTH_DIR                where the auth config and user database live
#                           (${XDG_STATE_HOME:-~/.local/state}/scalelab-mlflow); or set MLFLOW_AUTH_CONFIG_PATH
#   ALLOWED_HOSTS, CORS_ALLOWED_ORIGINS
#                           Host headers and browser origins accepted (others: 403, no CORS
#                           headers); derived from HOST and PORT, plus this machine's names and
#                           addresses when HOST is not loopback
#   ALLOW_NO_AUTH=1         serve without a password (without AUTH=basic): on loopback every local
#                           user, on another HOST anyone who can reach the port, can then read and
#                           write every run
#   CHECK_ONLY=1            check the settings (and the admin password), print what would run, exit
#   MLFLOW_SERVER_ENABLE_JOB_EXECUTION
#                           MLflow's job runner for GenAI jobs (false: scalelab submits none)
# Further arguments are passed on to `mlflow server`.
#
# Files: everything the server creates (the SQLite store, the artifact folder and every artifact,
# the auth config and user database) is readable by this user only (umask 077), and an existing
# SQLite store, artifact folder and auth files are set to 0600 / 0700 on every start: a store that
# others can read bypasses the password.
set -euo pipefail
umask 077

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MLFLOW="$REPO/.venv/bin/mlflow"
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-5000}"
BACKEND_STORE_URI="${BACKEND_STORE_URI:-sqlite:///$REPO/mlflow.db}"
AUTH="${AUTH:-}"
STORE=""

die() { echo "mlflow-server.sh: $*" >&2; exit 2; }

# Only real loopback may skip auth: localhost, ::1 and numeric 127.x.y.z (never 127.example.com).
is_loopback() {
  case "$1" in localhost|::1|"[::1]") return 0 ;; esac
  [[ "$1" =~ ^127\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] || return 1
  local n
  for n in "${BASH_REMATCH[@]:1}"; do [ "$((10#$n))" -le 255 ] || return 1; done
}

# A URI with its whole user info hidden (scheme://***@host/...): nothing of the user name or the
# password is shown, whatever characters (@ : /) the password holds.
mask_uri() {
  local rest="${1#*://}"
  case "$1" in *://*@*) printf '%s://***@%s' "${1%%://*}" "${rest##*@}" ;; *) printf '%s' "$1" ;; esac
}

# Existing store files and folders: this user only.
owner_only() {
  local path
  for path in "$@"; do
    if [ -L "$path" ]; then continue; fi
    if [ -d "$path" ]; then chmod 700 "$path"; elif [ -f "$path" ]; then chmod 600 "$path"; fi
  done
}

[ -x "$MLFLOW" ] || die "$MLFLOW not found: run \`make setup\` first"
# SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3; the lock file installs psycopg2.
case "$BACKEND_STORE_URI" in
  postgresql://*|postgres://*)
    if ! "$REPO/.venv/bin/python" -c "import psycopg" 2>/dev/null; then
      BACKEND_STORE_URI="postgresql+psycopg2://${BACKEND_STORE_URI#*://}"
    fi ;;
esac
case "$AUTH" in ""|basic) ;; *) die "AUTH=$AUTH is not allowed: use AUTH=basic or leave it unset" ;; esac
case "${ALLOW_NO_AUTH:-0}" in 0|1) ;; *) die "ALLOW_NO_AUTH=$ALLOW_NO_AUTH is not allowed: use 1 or leave it unset" ;; esac
# Basic auth on every bind: on a shared login node, loopback is every local user's too.
if [ -z "$AUTH" ] && [ "${ALLOW_NO_AUTH:-0}" != 1 ]; then AUTH=basic; fi

# The lab's store (this clone's DVC default remote): artifacts go to <store>/mlflow-artifacts. It
# is checked before the server starts; its endpoint and credentials reach the server (boto3) in
# the environment, never on the command line or in MLflow params and tags.
if [ -z "${ARTIFACTS_DESTINATION:-}" ]; then
  store_env="$(cd "$REPO" && REPO="$REPO" "$REPO/.venv/bin/python" -W ignore - <<'PY'
import os
import shlex
import sys

from scalelab.storage import MLFLOW_ARTIFACTS, StoreError, configured

try:
    store = configured(os.environ["REPO"])
    if store is not None:
        store.check()
except StoreError as exc:
    print(f"mlflow-server.sh: {exc}", file=sys.stderr)
    sys.exit(2)
if store is not None:
    print(f"ARTIFACTS_DESTINATION={shlex.quote(store.join(MLFLOW_ARTIFACTS))}")
    print(f"STORE={shlex.quote(store.describe())}")
    for key, value in store.env().items():
        print(f"export {key}={shlex.quote(value)}")
PY
)" || exit 2
  eval "$store_env"
fi
ARTIFACTS_DESTINATION="${ARTIFACTS_DESTINATION:-$REPO/mlartifacts}"

# The store URI goes in the environment, not the command line, where `ps` would show its password.
export MLFLOW_BACKEND_STORE_URI="$BACKEND_STORE_URI"
args=(server --serve-artifacts --artifacts-destination "$ARTIFACTS_DESTINATION" --host "$HOST" --port "$PORT")
[ -n "${WORKERS:-}" ] && args+=(--workers "$WORKERS")

# This machine's names and IPv4 addresses: what compute nodes and browsers use to reach it.
own_names() {
  { echo localhost; echo 127.0.0.1; hostname -s 2>/dev/null; hostname -f 2>/dev/null
    hostname -I 2>/dev/null | tr ' ' '\n' | grep -v ':'
    case "$HOST" in 0.0.0.0|::) ;; *) echo "$HOST" ;; esac; } | grep -v '^$' | sort -u
}

# MLflow rejects Host headers it does not know (DNS rebinding) and browser requests from other
# origins (CORS); the lists name this server's own addresses only.
if is_loopback "$HOST"; then
  names="$(printf '%s\n' localhost 127.0.0.1 "[::1]" "$HOST" | sed 's/^::1$/[::1]/' | sort -u)"
else
  names="$(own_names)"
fi
ALLOWED_HOSTS="${ALLOWED_HOSTS:-$(for n in $names; do printf '%s,%s:%s,' "$n" "$n" "$PORT"; done | sed 's/,$//')}"
CORS_ALLOWED_ORIGINS="${CORS_ALLOWED_ORIGINS:-$(for n in $names; do printf 'http://%s:%s,' "$n" "$PORT"; done | sed 's/,$//')}"
args+=(--allowed-hosts "$ALLOWED_HOSTS" --cors-allowed-origins "$CORS_ALLOWED_ORIGINS")

case "$ARTIFACTS_DESTINATION" in
  *://*) ;;
  *) mkdir -p "$ARTIFACTS_DESTINATION" && owner_only "$ARTIFACTS_DESTINATION" ;;
esac
case "$BACKEND_STORE_URI" in
  sqlite:///*)
    db="${BACKEND_STORE_URI#sqlite:///}" && db="${db%%\?*}"
    owner_only "$db" "$db-journal" "$db-wal" "$db-shm" ;;
esac

if [ "$AUTH" = basic ]; then
  "$REPO/.venv/bin/python" -c "import flask_wtf" 2>/dev/null \
    || die "AUTH=basic needs MLflow's auth extra (Flask-WTF): .venv/bin/pip install 'mlflow[auth]==$("$MLFLOW" --version | awk '{print $NF}')'"
  AUTH_DIR="${AUTH_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/scalelab-mlflow}"
  mkdir -p "$AUTH_DIR" && chmod 700 "$AUTH_DIR"
  if [ "${MLFLOW_AUTH_ADMIN_PASSWORD:-}" = password1234 ]; then
    die "AUTH=basic: MLFLOW_AUTH_ADMIN_PASSWORD = password1234 is not allowed: it is MLflow's old public default"
  fi
  if [ -z "${MLFLOW_AUTH_CONFIG_PATH:-}" ]; then
    [ -n "${MLFLOW_AUTH_ADMIN_PASSWORD:-}" ] \
      || die "AUTH=basic (the default on every bind, HOST=$HOST included): every start needs" \
             "MLFLOW_AUTH_ADMIN_PASSWORD, the password of admin user '${MLFLOW_AUTH_ADMIN_USERNAME:-admin}'" \
             "(or ALLOW_NO_AUTH=1 to serve without a password)"
    export MLFLOW_AUTH_CONFIG_PATH="$AUTH_DIR/basic_auth.ini"
    # default_permission: what users get on experiments and runs that others created
    cat > "$MLFLOW_AUTH_CONFIG_PATH" <<EOF
[mlflow]
default_permission = ${AUTH_DEFAULT_PERMISSION:-READ}
database_uri = sqlite:///$AUTH_DIR/basic_auth.db
admin_username = ${MLFLOW_AUTH_ADMIN_USERNAME:-admin}
EOF
  fi
  owner_only "$MLFLOW_AUTH_CONFIG_PATH" "$AUTH_DIR/basic_auth.db"
  # Every start (here too for a config of your own, which may hold admin_password): a password is
  # given, it is not MLflow's old default, and an existing admin user has it (the first start
  # creates the user database, which only this user can read).
  "$REPO/.venv/bin/python" -W ignore - <<'PY' || exit 2
import sys

from mlflow.server.auth.config import read_auth_config
from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore


def die(message):
    print(f"mlflow-server.sh: AUTH=basic: {message}", file=sys.stderr)
    sys.exit(2)


config = read_auth_config()
user, password = config.admin_username, config.admin_password
if not user:
    die("no admin user name: set MLFLOW_AUTH_ADMIN_USERNAME")
if not password:
    die(f"every start needs MLFLOW_AUTH_ADMIN_PASSWORD, the password of admin user {user!r}")
if password == "password1234":
    die("MLFLOW_AUTH_ADMIN_PASSWORD = password1234 is not allowed: it is MLflow's old public default")
if len(password) < 12:
    die("MLFLOW_AUTH_ADMIN_PASSWORD is too short: MLflow needs 12 characters or more")
store = SqlAlchemyStore()
store.init_db(config.database_uri)
if store.has_user(user, use_primary=True) and not store.authenticate_user(user, password, use_primary=True):
    if not store.authenticate_user(user, "password1234", use_primary=True):  # MLflow rotates that one itself
        die(
            f"MLFLOW_AUTH_ADMIN_PASSWORD is not the password of admin user {user!r}: give the current one "
            "(change it with MLflow's update-password API first)"
        )
PY
  owner_only "$AUTH_DIR/basic_auth.db"
  # The CSRF secret must be the same in every worker and across restarts: kept in AUTH_DIR.
  [ -s "$AUTH_DIR/secret_key" ] || od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$AUTH_DIR/secret_key"
  owner_only "$AUTH_DIR/secret_key"
  export MLFLOW_FLASK_SERVER_SECRET_KEY="${MLFLOW_FLASK_SERVER_SECRET_KEY:-$(cat "$AUTH_DIR/secret_key")}"
  args+=(--app-name basic-auth)
fi

# Never echo a database user or password.
echo "mlflow-server.sh: http://$HOST:$PORT  backend=$(mask_uri "$BACKEND_STORE_URI")" \
     " artifacts=$(mask_uri "$ARTIFACTS_DESTINATION")${STORE:+ (store $STORE)}${AUTH:+  auth=$AUTH}" >&2
if [ "${CHECK_ONLY:-0}" = 1 ]; then
  echo "mlflow-server.sh: CHECK_ONLY=1: settings accepted: would run mlflow ${args[*]} $*" >&2
  exit 0
fi
# MLflow's job runner (a runner and 7 huey consumer processes, ~16 s of CPU at every start) serves
# GenAI jobs that scalelab never submits: off unless MLFLOW_SERVER_ENABLE_JOB_EXECUTION says otherwise
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"
exec "$MLFLOW" "${args[@]}" "$@"
