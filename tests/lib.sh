# tests/lib.sh — shell helpers the test scripts share (source it: `. tests/lib.sh`).

# free_port: a TCP port below the kernel's ephemeral range (32768 up by default: the local ports of
# the tests' own client connections, which a listener cannot bind over — CI once saw "MASTER_PORT
# 33442 ... already in use") that no socket uses now. A race with another process stays possible;
# the range keeps it unlikely.
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 12000))
    ss -tanH 2>/dev/null | awk '{ print $4 }' | grep -q ":$p\$" || { echo "$p"; return; }
  done
  echo "$p"
}

# ---- Namespace hosts (tools/hosts.sh): what test_hosts.sh, test_mpi_hosts.sh and the benchmarks
# across hosts share. Source this file from the repository root.
HOSTS_TOKEN=0123456789abcdef0123456789abcdef   # DDP_JOB_TOKEN of the jobs across hosts
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# hosts_begin NAME PREFIX N [--rate RATE]: a set of N hosts of this script's own (DDP_HOSTS_PREFIX
# PREFIX + this shell's pid: parallel runs never meet), gone again when the script exits or is
# interrupted. Where the machine does not allow namespaces: "SKIP NAME: why", exit 0; where `up`
# fails: "FAIL NAME_up: its output", exit 1. Sets H (tools/hosts.sh), tmp (a directory removed at
# exit) and A1 (h1's address, where rank 0's store listens).
hosts_begin() {
    local name=$1 prefix=$2 n=$3 why
    shift 3
    H=$PWD/tools/hosts.sh
    export DDP_HOSTS_PREFIX=$prefix$(($$ % 100000))
    why=$("$H" check)
    if [ $? -eq 77 ]; then echo "SKIP $name: $why"; exit 0; fi
    tmp=$(mktemp -d)
    trap '"$H" down; rm -rf "$tmp"' EXIT
    trap 'exit 130' INT TERM
    if ! "$H" up "$n" "$@" >"$tmp/up.log" 2>&1; then echo "FAIL ${name}_up: $(cat "$tmp/up.log")"; exit 1; fi
    A1=$("$H" addr h1)
}

# hosts_mpirun HOSTS LIMIT_S PORT [mpirun options and the program...]: mpirun started on h1, its
# ranks on HOSTS (h1:2,h2:2 ...) started through tools/hosts.sh's agent, Open MPI's out-of-band
# traffic on the hosts' eth0, rank 0's store on h1 (MASTER_ADDR, MASTER_PORT=PORT, the job token:
# -x passes them). --bind-to none: the hosts share this machine's CPUs, and Open MPI, seeing 2 ranks
# or fewer on a "host", binds each host's first rank to core 0 -- the same core for every host
# (bench/RESULTS.md: the exchange at half the link's rate, 1 MiB at 3x its bound).
hosts_mpirun() {
    local hosts=$1 limit=$2 port=$3
    shift 3
    MASTER_ADDR=$A1 MASTER_PORT=$port DDP_JOB_TOKEN=$HOSTS_TOKEN timeout "$limit" "$H" exec h1 mpirun --allow-run-as-root \
        -H "$hosts" --bind-to none --mca plm_rsh_agent "$H agent" --mca oob_tcp_if_include eth0 \
        -x MASTER_ADDR -x MASTER_PORT -x DDP_JOB_TOKEN "$@"
}
