#!/usr/bin/env bash
# Stop the local SLURM cluster started by start.sh. Idempotent.
# Usage: slurm/local/stop.sh [STATE_DIR]   (default /tmp/scalelab-slurm)
# Jobs still queued or running are cancelled first (so no job processes are
# left behind). The state dir (job ids, accounting DB) is kept: start.sh
# resumes from it; delete it for a fresh cluster.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "${1:-}"
own_state_dir

if alive "$S/run/slurmctld.pid" slurmctld; then
  mapfile -t jobs < <(squeue -h -o %A 2>/dev/null | sort -u)
  if ((${#jobs[@]})); then
    log "cancelling jobs: ${jobs[*]}"
    scancel "${jobs[@]}" 2>/dev/null || true
    # shellcheck disable=SC2016  # expanded by sh -c
    wait_for "jobs to end" 30 sh -c '[ -z "$(squeue -h -o %A)" ]' || true
  fi
fi
for n in "${NODES[@]}"; do stop_pidfile "slurmd $n" "$S/run/slurmd-$n.pid" slurmd; done
stop_pidfile slurmctld "$S/run/slurmctld.pid" slurmctld
stop_pidfile slurmdbd "$S/run/slurmdbd.pid" slurmdbd
stop_pidfile mariadbd "$S/run/mariadb.pid" mariadbd
if [[ -e $S/run/munged.ours ]]; then   # only a munged that start.sh started
  stop_pidfile munged /run/munge/munged.pid munged
  rm -f "$S/run/munged.ours"
fi

# Remove our /etc/hosts line. Truncate and rewrite the file rather than
# sed -i (which replaces it): /etc/hosts may be a bind mount.
if grep -qF "$HOSTS_MARK" /etc/hosts; then
  hosts=$(grep -vF "$HOSTS_MARK" /etc/hosts || true)
  printf '%s\n' "$hosts" > /etc/hosts
fi
log "stopped"
