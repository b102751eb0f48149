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

# ---- Open MPI tests (test_mpi_parity.sh, test_mpi_hosts.sh, test_groups.sh, test_zero2_mpi.sh,
# test_hybrid.sh).
# mpi_begin NAME BUILD_DIR PROGRAM...: "SKIP NAME: why" and exit (status: 1 if the script counted
# failures in $fails before, else 0) in sanitizer builds (Open MPI's start-up and TCP progress
# under ASan/TSan take minutes a job: the MPI backend is checked in the plain build), without
# mpirun, or where a PROGRAM (a path) was not built.
mpi_begin() {
    local name=$1 b=$2 p
    shift 2
    case $b in *asan*|*tsan*) echo "SKIP $name: not in sanitizer builds (Open MPI under ASan/TSan takes minutes a job)"; exit $((${fails:-0} > 0)) ;; esac
    command -v mpirun >/dev/null || { echo "SKIP $name: no mpirun (apt-get install openmpi-bin libopenmpi-dev)"; exit $((${fails:-0} > 0)); }
    for p in "$@"; do
        [ -x "$p" ] || { echo "SKIP $name: no $p (built by make where mpicc is)"; exit $((${fails:-0} > 0)); }
    done
}

# mpi_local N LIMIT_S PROGRAM [ARGS...]: mpirun on this host, N ranks (oversubscribed: the
# machine may have fewer cores), TCP between them, rank 0's store on a free port and the job
# token; DDP_MPI_FLAT and DDP_LOG go to the ranks where set.
mpi_local() {
    local n=$1 limit=$2 pass=(-x MASTER_ADDR -x MASTER_PORT -x DDP_JOB_TOKEN)
    shift 2
    [ -n "${DDP_MPI_FLAT+x}" ] && pass+=(-x DDP_MPI_FLAT)
    [ -n "${DDP_LOG+x}" ] && pass+=(-x DDP_LOG)
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) DDP_JOB_TOKEN=$HOSTS_TOKEN timeout "$limit" mpirun --allow-run-as-root \
        --oversubscribe --bind-to none --mca btl tcp,self -n "$n" "${pass[@]}" "$@"
}

# bench_mpi_begin NAME BUILD_DIR TARGET...: for the benchmarks across namespace hosts (bench/
# mpi_hosts.sh, scaling_hosts.sh, outer_hosts.sh, hybrid_hosts.sh): "SKIP NAME bench: why" and exit
# 0 without mpirun or mpicc; else make the TARGETs (BUILD_DIR/mpi/train_gpt, ...) and
# BUILD_DIR/fortunes.txt (exit 1 where that fails), and set DATA: tinyshakespeare where
# ../shared has it, else the fortunes.
bench_mpi_begin() {
    local name=$1 b=$2
    shift 2
    command -v mpirun >/dev/null || { echo "SKIP $name bench: no mpirun"; exit 0; }
    [ -n "$(command -v mpicc)" ] || { echo "SKIP $name bench: no mpicc"; exit 0; }
    make --no-print-directory B="$b" "$@" "$b/fortunes.txt" >/dev/null || exit 1
    DATA=../shared/data/tinyshakespeare.txt
    [ -f "$DATA" ] || DATA=$b/fortunes.txt
}
