#!/usr/bin/env bash
# Start a real local SLURM cluster on this host (as root):
#   munged, MariaDB, slurmdbd, slurmctld and two slurmd (nodes n1 and n2).
# Usage: slurm/local/start.sh [STATE_DIR]   (default /tmp/scalelab-slurm)
#        source STATE_DIR/env.sh            (exports SLURM_CONF for the clients)
# Idempotent: daemons already running are left alone (a second run is a quick
# no-op); if the generated config changed, the cluster is stopped first.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "${1:-}"
t0=$SECONDS
own_state_dir create
mkdir -p "$S"/{run,log,ctld,spool/n1,spool/n2,mysql}

render() {  # render NAME: STATE_DIR/NAME.new from slurm/local/NAME.in
  sed -e "s|@STATE_DIR@|$S|g" -e "s|@CLUSTER@|$CLUSTER|g" -e "s|@HOST@|$HOST|g" \
      -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@DB_PORT@|$DB_PORT|g" \
      -e "s|@N1_PORT@|$N1_PORT|g" -e "s|@N2_PORT@|$N2_PORT|g" "$HERE/$1.in" > "$S/$1.new"
}
sql() { mariadb --no-defaults --socket="$DB_SOCK" -uroot -e "$1"; }
cancel_stale() {  # cancel_stale [squeue filters]: cancel jobs a crashed cluster left
  local jobs
  mapfile -t jobs < <(squeue -h -o %A "$@" | sort -u)
  ((${#jobs[@]} == 0)) || { log "cancelling jobs left from before: ${jobs[*]}"; scancel "${jobs[@]}" || true; }
}
registered() {  # registered NODE: its slurmd registered after $t_slurmd
  local t
  t=$(scontrol show node "$1" | grep -o 'SlurmdStartTime=[^ ]*') || return 1
  t=$(date -d "${t#*=}" +%s 2>/dev/null) && ((t >= t_slurmd))
}
nodes_in() {  # nodes_in REGEX: every node's state (sinfo %t) matches REGEX
  local states n
  states=$(sinfo -h -N -p debug -o '%N %t') || return 1
  for n in "${NODES[@]}"; do grep -Eq "^$n ($1)\$" <<<"$states" || return 1; done
}

# --- 1. configs from the templates ---------------------------------------------
render slurm.conf
render slurmdbd.conf
if ! cmp -s "$S/slurm.conf.new" "$S/slurm.conf" || ! cmp -s "$S/slurmdbd.conf.new" "$S/slurmdbd.conf"; then
  if alive "$S/run/slurmctld.pid" slurmctld || alive "$S/run/slurmdbd.pid" slurmdbd ||
     alive "$S/run/slurmd-n1.pid" slurmd || alive "$S/run/slurmd-n2.pid" slurmd; then
    log "config changed: restarting the cluster"
    "$HERE/stop.sh" "$S"
  fi
fi
mv -f "$S/slurm.conf.new" "$S/slurm.conf"
mv -f "$S/slurmdbd.conf.new" "$S/slurmdbd.conf"
chmod 600 "$S/slurmdbd.conf"   # slurmdbd refuses a config that others can read

# --- 2. node names resolve to this host (torch's MASTER_ADDR is a node name) ----
# This host's own name is added too if it does not resolve.
if ! grep -qF "$HOSTS_MARK" /etc/hosts; then
  names="${NODES[*]}"
  getent hosts "$HOST" >/dev/null || names+=" $HOST"
  echo "127.0.0.1 $names $HOSTS_MARK" >> /etc/hosts
fi

# --- 3. munge (reused if one already answers) -----------------------------------
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  if [[ ! -s /etc/munge/munge.key ]]; then   # normally created by the package
    runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged </dev/null >>"$S/log/munged.out" 2>&1
  touch "$S/run/munged.ours"   # tells stop.sh that we started it
  wait_for munge 10 sh -c 'munge -n | unmunge'
fi

# --- 4. MariaDB: our own instance, data in STATE_DIR, TCP 127.0.0.1:DB_PORT -----
if ! alive "$S/run/mariadb.pid" mariadbd; then
  if [[ ! -d $S/mysql/data/mysql ]]; then
    log "initialising MariaDB in $S/mysql/data"
    mariadb-install-db --no-defaults --user=root --datadir="$S/mysql/data" \
      --auth-root-authentication-method=socket --skip-test-db >"$S/log/mariadb-install.log" 2>&1
  fi
  # Every daemon is started with stdio redirected, so none holds the caller's
  # pipe open (e.g. `start.sh | tee` in CI would otherwise never finish).
  setsid mariadbd --no-defaults --user=root --datadir="$S/mysql/data" --socket="$DB_SOCK" \
    --bind-address=127.0.0.1 --port="$DB_PORT" --pid-file="$S/run/mariadb.pid" \
    --log-error="$S/log/mariadb.log" --skip-name-resolve \
    --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
    </dev/null >>"$S/log/mariadb.out" 2>&1 &
fi
wait_for mariadb 60 sql 'SELECT 1'
sql "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
     CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
     CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
     GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
     GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"

# --- 5. slurmdbd (reads slurmdbd.conf next to $SLURM_CONF), cluster record ------
if ! alive "$S/run/slurmdbd.pid" slurmdbd; then
  slurmdbd </dev/null >>"$S/log/slurmdbd.out" 2>&1
fi
wait_for slurmdbd 60 sacctmgr -n list cluster
if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
  sacctmgr -i add cluster "$CLUSTER" >/dev/null
fi

# --- 6. slurmctld (recovers STATE_DIR/ctld, so job ids keep counting up) --------
if ! alive "$S/run/slurmctld.pid" slurmctld; then
  slurmctld -f "$SLURM_CONF" </dev/null >>"$S/log/slurmctld.out" 2>&1
  fresh_ctld=1
  wait_for slurmctld 60 sh -c 'scontrol ping | grep -q UP'
  # Jobs recovered from a cluster that died without stop.sh would start again
  # (JobRequeue=1). Pending ones are cancelled now, before any node is up;
  # running ones once the nodes are up, so that the kill reaches their processes.
  cancel_stale -t PD,S
fi
wait_for slurmctld 60 sh -c 'scontrol ping | grep -q UP'

# --- 7. two slurmd on this host, one per node name ------------------------------
started=()
t_slurmd=$(($(date +%s) - 1))
for n in "${NODES[@]}"; do
  if ! alive "$S/run/slurmd-$n.pid" slurmd; then
    slurmd -f "$SLURM_CONF" -N "$n" </dev/null >>"$S/log/slurmd-$n.out" 2>&1
    started+=("$n")
  fi
done
for n in "${started[@]}"; do wait_for "slurmd $n to register" 60 registered "$n"; done
ok='idle|mix|alloc|comp'                             # a running cluster may be busy
[[ -z ${fresh_ctld:-} ]] || { cancel_stale; ok='idle'; }  # a fresh one has no jobs
wait_for "nodes ${NODES[*]} ($ok)" 60 nodes_in "$ok"
wait_for sacct 30 sacct -n -X -S now-1minutes

# --- 8. environment for the clients ---------------------------------------------
echo "export SLURM_CONF=$SLURM_CONF" > "$S/env.sh"
log "cluster '$CLUSTER' up in $((SECONDS - t0))s"
sinfo -N >&2
echo "export SLURM_CONF=$SLURM_CONF"
