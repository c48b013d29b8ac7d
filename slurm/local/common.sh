# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this
# Shared settings and helpers for start.sh / stop.sh (sourced, not run).
# Usage: source common.sh [STATE_DIR]
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RAW_S=${1:-${SCALELAB_SLURM_DIR:-/tmp/scalelab-slurm}}
S=$(realpath -m "$RAW_S")   # state dir: configs, pid files, logs, the accounting DB (own_state_dir)
CLUSTER=${SCALELAB_SLURM_CLUSTER:-scalelab}
HOST=$(hostname -s)
# Ports (override through the environment if they clash with something).
CTLD_PORT=${SCALELAB_SLURM_CTLD_PORT:-16817}
DBD_PORT=${SCALELAB_SLURM_DBD_PORT:-16819}
N1_PORT=${SCALELAB_SLURM_N1_PORT:-17001}
N2_PORT=${SCALELAB_SLURM_N2_PORT:-17002}
DB_PORT=${SCALELAB_SLURM_DB_PORT:-16306}
DB_SOCK=$S/mysql/mysqld.sock
NODES=(n1 n2)
HOSTS_MARK="# added by scalelab slurm/local/start.sh"
# Clients (sinfo, sbatch, sacct, ...) and slurmdbd (which reads slurmdbd.conf from
# the directory of SLURM_CONF) all find the config through this.
export SLURM_CONF=$S/slurm.conf

log() { echo "${0##*/}: $*" >&2; }

# own_state_dir [create]: the state dir is a real folder (not a symlink) owned by this user and
# closed to others (0700), or it is refused (exit 2) before anything is read or written in it.
# These scripts run as root and render the daemons' configs there, and .ci/run sources env.sh from
# it: a folder another user made first in /tmp would let that user control both.
own_state_dir() {
  local owner
  if [[ -L ${RAW_S%/} ]] || { [[ -e $S ]] && [[ ! -d $S ]]; }; then
    log "refusing state dir $RAW_S: not a plain folder (a symlink or a file); remove it or set SCALELAB_SLURM_DIR"
    exit 2
  fi
  if [[ -d $S ]]; then
    owner=$(stat -c %u "$S")
    if [[ $owner != "$(id -u)" ]]; then
      log "refusing state dir $S: it belongs to uid $owner, not to $(id -un) (whoever made it could rewrite the cluster's config); remove it or set SCALELAB_SLURM_DIR"
      exit 2
    fi
    chmod 0700 "$S"
  elif [[ ${1:-} == create ]]; then
    (umask 077 && mkdir -p "$S")
  fi
}

# alive PIDFILE [COMM]: the pid in PIDFILE runs (and its command name is COMM).
alive() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  # not a zombie / dying process (field 3 of /proc/PID/stat is the state)
  [[ ! $(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null) =~ ^[ZXx]$ ]] || return 1
  [[ -z ${2:-} ]] || [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$2" ]]
}

# wait_for DESC SECONDS CMD...: retry CMD every 0.2 s until it succeeds.
wait_for() {
  local desc=$1 secs=$2 i
  shift 2
  for ((i = 0; i < secs * 5; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  log "timed out after ${secs}s waiting for $desc; logs are in $S/log"
  return 1
}

# stop_pidfile NAME PIDFILE COMM: SIGTERM, wait up to 10 s, then SIGKILL; only when the pid in
# PIDFILE runs a command named COMM (a stale or planted pid file names someone else's process).
stop_pidfile() {
  local name=$1 f=$2 comm=$3 pid i
  if alive "$f" "$comm"; then
    pid=$(cat "$f")
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    # alive, not kill -0: an exited daemon may linger as a zombie when PID 1
    # does not reap orphans (containers/microVMs).
    for ((i = 0; i < 100; i++)); do alive "$f" "$comm" || break; sleep 0.1; done
    if alive "$f" "$comm"; then log "killing $name"; kill -KILL "$pid" 2>/dev/null || true; fi
  elif alive "$f"; then
    log "not stopping pid $(cat "$f") of $f: it runs $(cat "/proc/$(cat "$f")/comm" 2>/dev/null), not $comm"
  fi
  rm -f "$f"
}
