#!/usr/bin/env bash
# slurm.sh - a real single-node SLURM cluster on localhost, so CI runs the workflow through the
# same sbatch/srun/sacct path as a GPU cluster (Debian 12, root, no systemd, no cgroups).
#
#   .ci/slurm.sh up      install packages if missing, write configs, start munged, mariadbd,
#                        slurmdbd, slurmctld, slurmd (in that order), smoke-test; no-op if already up
#   .ci/slurm.sh down    cancel leftover jobs, stop exactly the daemons 'up' started (by PID)
#   .ci/slurm.sh status  recorded daemons and sinfo
#
# slurmdbd + MariaDB are not optional: the Snakemake SLURM plugin polls job states with sacct, and
# without accounting storage sacct fails and Snakemake waits forever on finished jobs.
#
# Environment (optional):
#   KVZAP_CI_PARTITION=gpu  KVZAP_CI_ACCOUNT=kvzap   mirror the real cluster's names. Neither is the
#       default (that is partition `ci-default`, account `ci-default`), so a job that lands in them was
#       placed there by the profile's partition/account settings, not by cluster defaults.
#   KVZAP_CI_GPUS=4  KVZAP_CI_CPUS=16  KVZAP_CI_MEM_MB=262144
#       the node declared to slurmctld (SlurmdParameters=config_overrides); larger than this
#       machine so the real profile's GPU/thread/memory requests schedule unchanged. GPUs are
#       fake: GRES files are symlinks to /dev/null, jobs only get CUDA_VISIBLE_DEVICES. Four, so
#       that the rehearsal's 2-GPU Qwen3-32B jobs share the node instead of leaving a core idle.
set -euo pipefail

PARTITION=${KVZAP_CI_PARTITION:-gpu}
ACCOUNT=${KVZAP_CI_ACCOUNT:-kvzap}
GPUS=${KVZAP_CI_GPUS:-4}
CPUS=${KVZAP_CI_CPUS:-16}
MEM_MB=${KVZAP_CI_MEM_MB:-262144}
STATE=/run/kvzap-slurm-ci
LOGDIR=/var/log/slurm
CLUSTER=kvzapci
NODE=localhost
DB_SOCKET=/run/mysqld/mysqld.sock
DB_PASS=ci-only-not-secret # MariaDB runs with --skip-networking: reachable through its socket only
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)

log() { printf '[slurm.sh %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

alive() { # a running process, not a zombie left behind right after a kill
  [[ -r /proc/$1/stat ]] && [[ $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) != Z ]]
}

recorded_alive() { [[ -f $STATE/$1.pid ]] && alive "$(cat "$STATE/$1.pid")"; }

start() { # start NAME CMD...: foreground-mode daemon, backgrounded here; $! is the daemon itself
  local name=$1; shift
  "$@" </dev/null >"$LOGDIR/$name.stdout" 2>&1 &
  echo $! >"$STATE/$name.pid"
  log "started $name (pid $!)"
}

await() { # await NAME TIMEOUT CMD...: poll CMD; fail fast with the log tail if NAME died
  local name=$1 deadline=$((SECONDS + $2)) pid; shift 2
  pid=$(cat "$STATE/$name.pid")
  until "$@" >/dev/null 2>&1; do
    alive "$pid" || { tail -n 20 "$LOGDIR/$name.stdout" >&2; die "$name exited during startup"; }
    ((SECONDS < deadline)) || die "$name not ready after $2 s"
    sleep 0.5
  done
}

stop() { # stop NAME: TERM the recorded PID if it still is NAME (never a recycled PID), KILL after 30 s
  local name=$1 pid comm
  [[ -f $STATE/$name.pid ]] || return 0
  pid=$(cat "$STATE/$name.pid")
  if alive "$pid"; then
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    if [[ $comm == "$name" ]]; then
      kill -TERM "$pid" 2>/dev/null || true
      local deadline=$((SECONDS + 30))
      while alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
      alive "$pid" && kill -KILL "$pid" 2>/dev/null
      log "stopped $name (pid $pid)"
    else
      log "pid $pid is now '$comm', not $name: left alone"
    fi
  fi
  rm -f "$STATE/$name.pid"
}

install_packages() {
  local pkgs=(slurm-wlm slurm-client slurmdbd munge mariadb-server) p missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  # On a systemd host apt would start munge/mariadb/slurm units itself; this script owns the daemons.
  local own_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  log "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  ((own_policy)) && rm -f /usr/sbin/policy-rc.d
  return 0
}

write_configs() {
  mkdir -p /etc/slurm "$STATE/fakegpu"
  local gres="" gres_conf="" i
  if ((GPUS > 0)); then
    # gres/gpu needs File= to be a device; symlinks to /dev/null pass the check
    for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$STATE/fakegpu/nvidia$i"; done
    gres=" Gres=gpu:$GPUS"
    gres_conf="GresTypes=gpu
AccountingStorageTRES=gres/gpu"
    echo "NodeName=$NODE Name=gpu File=$STATE/fakegpu/nvidia[0-$((GPUS - 1))]" >/etc/slurm/gres.conf
  else
    rm -f /etc/slurm/gres.conf
  fi
  cat >/etc/slurm/slurm.conf <<EOF
# written by kvzap .ci/slurm.sh: single-node CI cluster
ClusterName=$CLUSTER
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
ReturnToService=2
MinJobAge=300
KillWait=5
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
$gres_conf
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM_MB$gres State=UNKNOWN
PartitionName=ci-default Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=$PARTITION Nodes=$NODE Default=NO MaxTime=INFINITE State=UP
EOF
  cat >/etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
LogFile=$LOGDIR/slurmdbd.log
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=kvzap_ci_acct
EOF
  chmod 600 /etc/slurm/slurmdbd.conf # slurmdbd refuses a config others can read
}

cmd_up() {
  [[ $EUID -eq 0 ]] || die "run as root"
  local t0=$SECONDS d up=0
  for d in "${DAEMONS[@]}"; do recorded_alive "$d" && up=$((up + 1)); done
  if ((up == ${#DAEMONS[@]})) && sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    log "already up"; return 0
  fi
  ((up == 0)) || cmd_down # half up (a crashed daemon): restart cleanly
  trap 'log "up failed: stopping what was started"; cmd_down' EXIT
  install_packages
  mkdir -p "$STATE" "$LOGDIR" /var/spool/slurmctld /var/spool/slurmd
  rm -rf /var/spool/slurmctld/* /var/spool/slurmd/* # fresh job ids and node state every time
  write_configs

  install -d -o munge -g munge -m 0755 /run/munge
  [[ -s /etc/munge/munge.key ]] || mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  start munged setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --foreground
  await munged 30 bash -c 'munge -n | unmunge'

  install -d -o mysql -g mysql -m 0755 /run/mysqld
  [[ -d /var/lib/mysql/mysql ]] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
  start mariadbd /usr/sbin/mariadbd --user=mysql --skip-networking --socket=$DB_SOCKET \
    --pid-file=/run/mysqld/mysqld.pid --innodb-lock-wait-timeout=900
  await mariadbd 60 mariadb-admin --socket=$DB_SOCKET ping
  mariadb --socket=$DB_SOCKET <<EOF
DROP DATABASE IF EXISTS kvzap_ci_acct;
CREATE DATABASE kvzap_ci_acct;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON kvzap_ci_acct.* TO 'slurm'@'localhost';
EOF
  start slurmdbd /usr/sbin/slurmdbd -D
  await slurmdbd 60 sacctmgr -n list cluster
  # cluster, account and user must exist before slurmctld registers
  sacctmgr -i add cluster "$CLUSTER" >/dev/null
  sacctmgr -i add account "$ACCOUNT",ci-default Cluster="$CLUSTER" Description=ci Organization=ci >/dev/null
  sacctmgr -i add user root Account="$ACCOUNT",ci-default DefaultAccount=ci-default >/dev/null

  start slurmctld /usr/sbin/slurmctld -D
  await slurmctld 60 bash -c 'scontrol ping | grep -q "is UP"'
  start slurmd /usr/sbin/slurmd -D -N "$NODE"
  await slurmd 60 bash -c "sinfo -h -n $NODE -o %T | grep -qx idle"
  smoke
  trap - EXIT
  log "cluster up in $((SECONDS - t0)) s: partition=$PARTITION account=$ACCOUNT gpus=$GPUS"
}

smoke() { # one sbatch job must finish and be visible to sacct (what the Snakemake plugin polls)
  local jid deadline=$((SECONDS + 60)) gpu=()
  ((GPUS == 0)) || gpu=(--gpus=1)
  jid=$(sbatch --parsable -A "$ACCOUNT" -p "$PARTITION" -t 1 -o /dev/null "${gpu[@]}" --wrap true)
  until sacct -X -n -P -j "$jid" -o State 2>/dev/null | grep -qx COMPLETED; do
    ((SECONDS < deadline)) || die "smoke job $jid not COMPLETED in sacct after 60 s"
    sleep 0.5
  done
}

cmd_down() {
  if recorded_alive slurmctld; then
    local jobs
    jobs=$(squeue -h -o %i 2>/dev/null || true)
    # shellcheck disable=SC2086 # one job id per word
    [[ -z $jobs ]] || { log "cancelling jobs $jobs"; scancel $jobs || true; sleep 2; }
  fi
  local i
  for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do stop "${DAEMONS[i]}"; done
  rm -rf "$STATE/fakegpu"
}

cmd_status() {
  local d
  for d in "${DAEMONS[@]}"; do
    if recorded_alive "$d"; then echo "$d pid $(cat "$STATE/$d.pid") running"; else echo "$d not running"; fi
  done
  sinfo 2>/dev/null || true
}

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
