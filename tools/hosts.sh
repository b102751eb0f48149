#!/usr/bin/env bash
# hosts.sh — 2 or 3 "hosts" on this machine, as separate as one kernel allows, for multi-node tests.
#
#   tools/hosts.sh up [N] [--rate RATE]   make hosts h1..hN (N = 2 or 3, default 2); again: no-op
#   tools/hosts.sh down                   stop every process in them, remove them (also if half made)
#   tools/hosts.sh exec HOST CMD [ARGS..] run CMD inside HOST (its network, mounts, hostname; same cwd)
#   tools/hosts.sh kill HOST              SIGKILL every process inside HOST (the host crashes)
#   tools/hosts.sh list                   one line per host: name, address, rate, pids inside
#   tools/hosts.sh addr HOST              the host's address (10.77.0.1 for h1, ...)
#   tools/hosts.sh agent HOST CMD...      for mpirun --mca plm_rsh_agent: like ssh HOST CMD
#   tools/hosts.sh check                  exit 0 if this machine allows the namespaces, else 77
#
# Each host has
#   - a network namespace with one interface, eth0 = 10.77.0.K/24 (hK), and loopback; eth0 is a
#     veth whose other end sits on a bridge inside a "switch" namespace of its own, so nothing
#     is added to the machine's own network and traffic never leaves these namespaces;
#   - a mount namespace with its own tmpfs on /dev/shm (a CPU-backend segment made on h1 is not
#     visible on h2), and a UTS namespace with hostname hK;
#   - with --rate (tc's units: 1gbit, 100mbit, ...), a token-bucket filter (tbf) on both directions
#     of its link. This kernel has no netem: latency is not emulated here; where a benchmark needs
#     it, ddp.h's inject_comm_latency_ms adds it.
# Hosts share the machine's processes, users and files (only /dev/shm differs) and its clock.
#
# Several sets of hosts can exist at once: DDP_HOSTS_PREFIX (default "ddph") names the set; its
# namespaces are ${prefix}-h1.. and ${prefix}-sw, its state /run/ddp-hosts/$prefix. Tests use a
# prefix of their own, so parallel test runs do not meet.
# `up` interrupted or failed half-way removes what it made. Needs root (or CAP_SYS_ADMIN and
# CAP_NET_ADMIN) and ip, tc, unshare, nsenter, mount (iproute2, util-linux); `check` says
# whether they are here (exit 77 = skip, as tests expect).
set -u
PREFIX=${DDP_HOSTS_PREFIX:-ddph}
STATE=/run/ddp-hosts/$PREFIX
SUBNET=10.77.0
me=$(basename "$0")

die() { echo "$me: $*" >&2; exit 1; }
usage() { sed -n '4,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

case $PREFIX in *[!a-z0-9]*|"") die "DDP_HOSTS_PREFIX must be lowercase letters and digits, not '$PREFIX'" ;; esac
[ ${#PREFIX} -le 10 ] || die "DDP_HOSTS_PREFIX '$PREFIX' is longer than 10 characters"

# Why this machine cannot have hosts, or nothing.
why_not() {
    local t
    for t in ip tc unshare nsenter mount umount; do
        command -v "$t" >/dev/null 2>&1 || { echo "no '$t' (install iproute2 and util-linux)"; return; }
    done
    [ "$(id -u)" = 0 ] || { echo "not root (network and mount namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"; return; }
    unshare --net --mount --uts true 2>/dev/null || { echo "unshare --net --mount --uts is refused here (a container without CAP_SYS_ADMIN?)"; return; }
    unshare --net sh -c 'ip link add ddpchk0 type bridge && ip link add ddpchk1 type veth peer name ddpchk2' 2>/dev/null ||
        { echo "no bridge or veth devices in a network namespace (kernel modules bridge, veth)"; return; }
}

hosts() { local f; for f in "$STATE"/h*.addr; do [ -e "$f" ] && basename "$f" .addr; done; }
ns() { echo "$PREFIX-$1"; }

# Processes inside a host: those in its network namespace.
ns_pids() { ip netns pids "$(ns "$1")" 2>/dev/null; }

down() {
    local h pids n
    for h in $(hosts) h1 h2 h3; do
        [ -e "/run/netns/$(ns "$h")" ] || continue
        pids=$(ns_pids "$h")
        if [ -n "$pids" ]; then
            # shellcheck disable=SC2086
            kill -TERM $pids 2>/dev/null
            for _ in $(seq 20); do [ -z "$(ns_pids "$h")" ] && break; sleep 0.1; done
            pids=$(ns_pids "$h")
            # shellcheck disable=SC2086
            [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
        fi
    done
    for n in h1 h2 h3; do
        for f in "$STATE/$n.mnt" "$STATE/$n.uts"; do
            [ -e "$f" ] && { umount "$f" 2>/dev/null || umount -l "$f" 2>/dev/null; rm -f "$f"; }
        done
        ip netns del "$(ns "$n")" 2>/dev/null
        rm -f "$STATE/$n.addr" "$STATE/$n.rate"
    done
    ip netns del "$(ns sw)" 2>/dev/null
    rm -f "$STATE/rate"
    if mountpoint -q "$STATE" 2>/dev/null; then umount "$STATE" 2>/dev/null || umount -l "$STATE"; fi
    rmdir "$STATE" 2>/dev/null
    rmdir /run/ddp-hosts 2>/dev/null
    return 0
}

# A token-bucket filter at RATE: a burst of 4 ms at that rate (at least 32 KiB: the timer's tick
# must not starve it), 50 ms of queue. DDP_HOSTS_TBF_BURST (bytes; 0: the 32 KiB floor) and
# DDP_HOSTS_TBF_LATENCY (tc's time, e.g. 5ms) change them, to see whether the shaper matters.
shape() { # NETNS DEV RATE
    local bits num unit burst lat=${DDP_HOSTS_TBF_LATENCY:-50ms}
    num=$(echo "$3" | sed -E 's/^([0-9]+).*/\1/'); unit=$(echo "$3" | sed -E 's/^[0-9]+//' | tr 'A-Z' 'a-z')
    case $unit in bit) bits=$num ;; kbit) bits=$((num * 1000)) ;; mbit) bits=$((num * 1000000)) ;;
        gbit) bits=$((num * 1000000000)) ;; *) die "--rate '$3': use an integer with bit, kbit, mbit or gbit" ;; esac
    burst=${DDP_HOSTS_TBF_BURST:-$((bits / 8 / 250))}
    case $burst in *[!0-9]*|"") die "DDP_HOSTS_TBF_BURST '$burst' is not a number of bytes" ;; esac
    [ "$burst" -ge 32768 ] || burst=32768
    ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst "$burst" latency "$lat"
}

up() {
    local n=2 rate="" i h
    while [ $# -gt 0 ]; do
        case $1 in
            --rate) [ $# -ge 2 ] || die "up: --rate needs a value such as 1gbit"; rate=$2; shift 2 ;;
            --rate=*) rate=${1#--rate=}; shift ;;
            [0-9]*) n=$1; shift ;;
            *) die "up: unknown argument '$1'" ;;
        esac
    done
    case $n in 2|3) ;; *) die "up: N must be 2 or 3, not '$n'" ;; esac
    local why; why=$(why_not)
    if [ -n "$why" ]; then echo "$me: cannot make hosts: $why" >&2; exit 77; fi
    if [ -n "$rate" ] && ! echo "$rate" | grep -Eqi '^[1-9][0-9]*(bit|kbit|mbit|gbit)$'; then
        die "up: --rate '$rate' is not a rate such as 1gbit, 100mbit, 500kbit"
    fi
    if [ -e "$STATE/h$n.addr" ] && [ ! -e "$STATE/h$((n + 1)).addr" ] && [ "$(cat "$STATE/rate" 2>/dev/null)" = "$rate" ]; then
        return 0   # already up as asked
    fi
    down
    trap 'down; exit 130' INT TERM
    trap 'down' EXIT   # removed once everything is made
    mkdir -p "$STATE" || die "cannot create $STATE"
    # Persistent mount namespaces are bind mounts of nsfs files: their directory must be private.
    mount --bind "$STATE" "$STATE" && mount --make-private "$STATE" || die "cannot make $STATE a private mount"
    ip netns add "$(ns sw)" || die "cannot create network namespace $(ns sw)"
    ip -n "$(ns sw)" link add br0 type bridge && ip -n "$(ns sw)" link set br0 up && ip -n "$(ns sw)" link set lo up ||
        die "cannot create the bridge"
    for i in $(seq 1 "$n"); do
        h=h$i
        ip netns add "$(ns $h)" || die "cannot create network namespace $(ns $h)"
        ip link add eth0 netns "$(ns $h)" type veth peer name "$h" netns "$(ns sw)" || die "cannot create $h's link"
        ip -n "$(ns sw)" link set "$h" master br0 && ip -n "$(ns sw)" link set "$h" up &&
        ip -n "$(ns $h)" addr add "$SUBNET.$i/24" dev eth0 && ip -n "$(ns $h)" link set eth0 up &&
        ip -n "$(ns $h)" link set lo up || die "cannot configure $h's link"
        if [ -n "$rate" ]; then
            shape "$(ns $h)" eth0 "$rate" && shape "$(ns sw)" "$h" "$rate" || die "cannot shape $h's link to $rate"
        fi
        touch "$STATE/$h.mnt" "$STATE/$h.uts"
        # The namespaces stay alive through their bind mounts once this process exits.
        unshare --mount="$STATE/$h.mnt" --uts="$STATE/$h.uts" --propagation private \
            sh -c "mount -t tmpfs -o mode=1777,size=50% $PREFIX-$h-shm /dev/shm && hostname $h" ||
            die "cannot create $h's mount namespace with its own /dev/shm"
        echo "$SUBNET.$i" >"$STATE/$h.addr"
        echo "$rate" >"$STATE/$h.rate"
    done
    echo "$rate" >"$STATE/rate"
    trap - EXIT INT TERM
}

enter() { # HOST CMD...
    local h=$1; shift
    [ -e "$STATE/$h.addr" ] || die "no host '$h' (tools/hosts.sh up first; hosts: $(hosts | tr '\n' ' '))"
    # Inside a host (mpirun's agent starting ranks on h2 from h1) the hosts' namespace files are
    # not mounted: that mount namespace was copied, privately, before they were. Go back to the
    # mount namespace of the nearest ancestor outside the hosts (whoever ran `exec h1 mpirun`),
    # where they are, and enter from there.
    if [ "$(stat -f -c %T "$STATE/$h.mnt" 2>/dev/null)" != nsfs ]; then
        local p=$PPID mine; mine=$(readlink /proc/self/ns/mnt)
        while [ "$p" -gt 1 ]; do
            if [ "$(readlink "/proc/$p/ns/mnt" 2>/dev/null)" != "$mine" ] &&
               nsenter --mount="/proc/$p/ns/mnt" stat -f -c %T "$STATE/$h.mnt" 2>/dev/null | grep -qx nsfs; then
                exec nsenter --mount="/proc/$p/ns/mnt" --wd="$PWD" -- "$0" exec "$h" "$@"
            fi
            p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null || echo 1)
        done
        die "host '$h': its namespaces are not reachable from here (half made or gone, or this process does not descend from one outside the hosts)"
    fi
    exec nsenter --net="/run/netns/$(ns "$h")" --mount="$STATE/$h.mnt" --uts="$STATE/$h.uts" --wd="$PWD" -- "$@"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
    -h|--help|help) sed -n '4,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    up) up "$@" ;;
    down) down ;;
    exec) [ $# -ge 2 ] || usage; enter "$@" ;;
    agent)
        # Open MPI calls its rsh agent as `AGENT [ssh options] HOST COMMAND...` (COMMAND one shell line).
        while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do   # ssh's options; these take a value
            case $1 in -[bcDEeFIiJLlmOopQRSWw]) shift ;; esac
            [ $# -gt 0 ] && shift
        done
        [ $# -ge 2 ] || die "agent: expected HOST COMMAND"
        h=$1; shift
        enter "$h" /bin/sh -c "$*" ;;
    kill)
        [ $# -eq 1 ] || usage; [ -e "$STATE/$1.addr" ] || die "no host '$1'"
        pids=$(ns_pids "$1")
        # shellcheck disable=SC2086
        [ -z "$pids" ] || kill -KILL $pids 2>/dev/null
        exit 0 ;;
    addr) [ $# -eq 1 ] || usage; [ -e "$STATE/$1.addr" ] || die "no host '$1'"; cat "$STATE/$1.addr" ;;
    list)
        for h in $(hosts); do
            echo "$h $(cat "$STATE/$h.addr") rate=$(cat "$STATE/$h.rate" 2>/dev/null | sed 's/^$/none/') pids=$(ns_pids "$h" | tr '\n' ' ')"
        done ;;
    check) why=$(why_not); if [ -n "$why" ]; then echo "$why"; exit 77; fi ;;
    *) usage ;;
esac
