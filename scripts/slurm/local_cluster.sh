#!/usr/bin/env bash
# A real, single-host Slurm cluster (slurmctld + slurmd on this machine) for tests and for trying
# the sbatch script by hand. Everything lives under DIR: slurm.conf, state, spool, logs, PIDs.
#
#   scripts/slurm/local_cluster.sh start DIR   # writes DIR/slurm.conf, starts both daemons, waits for `idle`
#   eval "$(scripts/slurm/local_cluster.sh env DIR)"   # exports SLURM_CONF for srun/sbatch/squeue
#   scripts/slurm/local_cluster.sh stop DIR    # cancels every job, stops the daemons it started
#
# Needs root (AuthType=auth/none and SlurmUser=root; no munge daemon) and the Debian packages
# slurmctld slurmd slurm-client (scripts/setup.sh installs them). Both commands are idempotent:
# `start` on a running cluster only waits for it to be idle; `stop` on a stopped one does nothing.
# Every wait is bounded. Only the PIDs this script recorded are signalled, after checking that
# /proc/PID/exe still is the Slurm daemon (a PID may have been reused).
#
# Environment: LOCAL_SLURM_CPUS (CPUs the node declares; default max(nproc, 8): with
# SlurmdParameters=config_overrides a node may declare more CPUs than it has, so `srun -n 4` works
# on 2 cores), LOCAL_SLURM_PORT (slurmctld port, slurmd uses +1; default: the first free pair
# from 6817, so two clusters on one host do not collide).
set -euo pipefail

die() { echo "[local_cluster] ERROR: $*" >&2; exit 1; }
log() { echo "[local_cluster] $*" >&2; }

usage() { sed -n '2,8p' "$0" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
dir=$2
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)  # absolute: slurm.conf paths and SLURM_CONF must not depend on the cwd
conf=$dir/slurm.conf
# One start/stop at a time per cluster directory (a trap's stop may race a start).
exec 9>"$dir/.lock"
flock -w 120 9 || { echo "[local_cluster] ERROR: $dir/.lock held for 120 s" >&2; exit 1; }
export SLURM_CONF=$conf
node=$(hostname -s)

# True when the PID recorded in FILE is alive and is the program NAME (guards against PID reuse).
recorded_alive() {
  local file=$1 name=$2 pid exe
  [ -f "$file" ] || return 1
  pid=$(cat "$file")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  exe=$(basename "${exe% (deleted)}")
  # Debian installs the daemons as slurmctld-wlm / slurmd-wlm behind alternatives symlinks.
  [ "$exe" = "$name" ] || [ "$exe" = "$name-wlm" ]
}

# wait_until SECONDS CMD...: polls CMD every 0.2 s; fails after SECONDS.
wait_until() {
  local limit=$1; shift
  local end=$((SECONDS + limit))
  until "$@"; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.2
  done
}

node_idle() { [ "$(timeout 5 sinfo -h -n "$node" -o %t 2>/dev/null)" = "idle" ]; }
queue_empty() { [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ]; }
# slurmd keeps a socket per running step (<node>_<job>.<step>) in its spool dir.
no_step_sockets() { ! compgen -G "$dir/spool/${node}_*" >/dev/null; }
port_free() { [ -z "$(ss -Htln "( sport = :$1 )" 2>/dev/null)" ]; }

pick_port() {
  if [ -n "${LOCAL_SLURM_PORT:-}" ]; then echo "$LOCAL_SLURM_PORT"; return; fi
  local p
  for ((p = 6817; p < 6917; p += 2)); do
    if port_free "$p" && port_free $((p + 1)); then echo "$p"; return; fi
  done
  die "no free port pair in 6817-6916 for slurmctld/slurmd"
}

write_conf() {
  local cpus=${LOCAL_SLURM_CPUS:-$(($(nproc) > 8 ? $(nproc) : 8))}
  local mem_mb=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 * 9 / 10))
  local port; port=$(pick_port)
  cat >"$conf" <<EOF
# Written by scripts/slurm/local_cluster.sh: one node, this host, everything under $dir.
ClusterName=local
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
# No munge: this build ships auth_none/cred_none, which work when everything runs as root.
AuthType=auth/none
CredType=cred/none
# slurmd refuses to launch a job id it has killed until the credential lifetime has passed, and
# slurmctld holds a requeued job for that long (default 120 s); 10 s keeps the requeue test short.
AuthInfo=cred_expire=10
MpiDefault=none
# No cgroups in containers: track step processes by /proc, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Trust the CPUs/memory declared below over what slurmd detects (lets 2 cores run -n 4).
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
# Keep finished jobs visible to scontrol show job for 10 min (no accounting, so no sacct).
MinJobAge=600
# SIGTERM → SIGKILL grace at a time limit or plain scancel; short so teardown is quick.
KillWait=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pidfile
SlurmdPidFile=$dir/slurmd.pidfile
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
}

# Starts DAEMON in its own session (it must not die with the caller's terminal or process group)
# and records its PID. `setsid` execs in place when the shell's child is not a group leader, so
# $! is the daemon; the daemon's own pid file is the fallback if setsid had to fork.
start_daemon() {
  local name=$1; shift
  setsid "$name" "$@" </dev/null >>"$dir/log/$name.out" 2>&1 &
  local pid=$!
  echo "$pid" >"$dir/$name.pid"
  if ! wait_until 5 recorded_alive "$dir/$name.pid" "$name"; then
    if [ -f "$dir/$name.pidfile" ] && recorded_alive "$dir/$name.pidfile" "$name"; then
      cp "$dir/$name.pidfile" "$dir/$name.pid"
    else
      tail -n 20 "$dir/log/$name.out" "$dir/log/$name.log" >&2 2>/dev/null || true
      die "$name did not start (logs above, $dir/log/)"
    fi
  fi
}

start() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (auth/none with SlurmUser=root)"
  local prog
  for prog in slurmctld slurmd sinfo srun sbatch squeue scancel scontrol; do
    command -v "$prog" >/dev/null ||
      die "$prog not found: install Slurm with scripts/setup.sh (packages slurmctld slurmd slurm-client)"
  done
  if recorded_alive "$dir/slurmctld.pid" slurmctld && recorded_alive "$dir/slurmd.pid" slurmd; then
    log "already running in $dir"
  else
    # A half-started or crashed cluster: clear it out before starting a fresh one.
    stop_cluster
    # Fresh state on every start, or jobs of an earlier run come back from StateSaveLocation.
    rm -rf "$dir/state" "$dir/spool" "$dir/log"
    mkdir -p "$dir/state" "$dir/spool" "$dir/log"
    write_conf
    start_daemon slurmctld -D -f "$conf"
    start_daemon slurmd -D -N "$node" -f "$conf"
  fi
  if ! wait_until 30 node_idle; then
    tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 2>/dev/null || true
    sinfo -N -l >&2 2>/dev/null || true
    die "node $node not idle after 30 s (logs above, $dir/log/)"
  fi
  log "up: node $node idle; export SLURM_CONF=$conf"
}

# Signals the recorded daemon NAME: TERM, then KILL after a bounded wait. A PID that is no longer
# that daemon is left alone.
stop_daemon() {
  local name=$1 file=$dir/$1.pid pid
  if recorded_alive "$file" "$name"; then
    pid=$(cat "$file")
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_until 15 eval "! recorded_alive '$file' '$name'"; then
      log "$name ($pid) ignored SIGTERM for 15 s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      wait_until 5 eval "! recorded_alive '$file' '$name'" || log "$name ($pid) still alive after SIGKILL"
    fi
  fi
  rm -f "$file"
}

stop_cluster() {
  if recorded_alive "$dir/slurmctld.pid" slurmctld; then
    # Cancel everything first: job steps (slurmstepd and the tasks) outlive slurmd otherwise.
    # --full signals the batch shell and all its children, not only the steps.
    timeout 10 scancel --full --user=root 2>/dev/null || true
    wait_until 30 queue_empty || log "jobs still queued after 30 s: $(timeout 5 squeue -h 2>/dev/null | tr '\n' ';')"
  fi
  if recorded_alive "$dir/slurmd.pid" slurmd; then
    wait_until 30 no_step_sockets || log "step sockets left in $dir/spool after 30 s: $(ls "$dir/spool" | tr '\n' ' ')"
  fi
  stop_daemon slurmd
  stop_daemon slurmctld
}

case $cmd in
  start) start ;;
  stop)
    if [ -f "$dir/slurmctld.pid" ] || [ -f "$dir/slurmd.pid" ]; then
      stop_cluster
      log "stopped ($dir)"
    else
      log "not running ($dir)"
    fi
    ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *) usage ;;
esac
