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
