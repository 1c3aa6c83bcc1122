#!/usr/bin/env bash
# An emulated cluster on one machine: W ranks, each in a network namespace of its own,
# each joined by a veth pair to a bridge in a switch namespace, every link limited to
# RATE in both directions by a token bucket (tc tbf). Runs COMMAND once per rank inside
# its namespace with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set (what
# torch.distributed's env:// rendezvous reads; GLOO_SOCKET_IFNAME names the rank's link),
# and removes every namespace and link it made on exit, on failure and on Ctrl-C.
#
#   bash experiments/cluster.sh [--ranks W] [--rate RATE] [--timeout S] [--check] [-- COMMAND ...]
#
#   --ranks W     ranks (default 4), addresses 198.18.0.1 .. 198.18.0.W (benchmarking range)
#   --rate RATE   each link's rate, as tc writes it: 1gbit (default), 10gbit, 200mbit, ...
#   --timeout S   bound on COMMAND on every rank, in seconds (default 600)
#   --check       first measure the link: one socket transfer from rank 1 to rank 0 must
#                 reach RATE within 10% (the rate is printed either way)
#
# No added delay: the kernel here has tbf and bridges but not netem, so links have the
# latency of a veth pair (microseconds), not of a real network. Exits 77 (skipped), having
# made nothing, where it cannot make namespaces, bridges or tbf (no CAP_NET_ADMIN);
# otherwise COMMAND's status (the first rank's that failed), 124 on the timeout.
set -euo pipefail

ranks=4
rate=1gbit
limit=600
check=0
command=()
while (($#)); do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    --check) check=1; shift ;;
    --) shift; command=("$@"); break ;;
    *) echo "cluster.sh: unknown argument '$1' (see the header of experiments/cluster.sh)" >&2; exit 2 ;;
  esac
done
[[ $ranks =~ ^[0-9]+$ ]] && ((ranks >= 1 && ranks <= 200)) ||
  { echo "cluster.sh: --ranks must be in [1, 200], got '$ranks'" >&2; exit 2; }
[[ $limit =~ ^[0-9]+$ ]] && ((limit >= 1)) || { echo "cluster.sh: --timeout must be a whole number of seconds, got '$limit'" >&2; exit 2; }
bits_per_second=$(/usr/bin/python3 - "$rate" <<'EOF'
import re, sys
m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(|k|m|g)bit", sys.argv[1].lower())
print(int(float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m[2]]) if m else 0)
EOF
)
((bits_per_second >= 1000000 && bits_per_second <= 100000000000)) ||
  { echo "cluster.sh: --rate must be between 1mbit and 100gbit, written as tc does (1gbit, 200mbit), got '$rate'" >&2; exit 2; }
((check || ${#command[@]})) || { echo "cluster.sh: nothing to do: give --check or -- COMMAND" >&2; exit 2; }

# Names unique to this run, so that runs side by side (ctest -j) never meet.
tag="gc$$"
switch="$tag-sw"
rank_ns() { echo "$tag-r$1"; }
address() { echo "198.18.0.$(($1 + 1))"; }
made=()  # namespaces to remove; deleting a namespace deletes the veth ends and the bridge in it
pids=()

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  for ns in "${made[@]}"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    ip netns delete "$ns" 2>/dev/null || true
  done
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Can this process make what it needs? Try each kind once, in a namespace of its own.
probe="$tag-probe"
skip() {
  echo "cluster.sh: skipped: $1 (needs root with CAP_NET_ADMIN, iproute2, and the bridge and tbf kernel modules)"
  exit 77
}
command -v ip > /dev/null && command -v tc > /dev/null || skip "ip and tc (iproute2) not found"
ip netns add "$probe" 2> /dev/null || skip "cannot make a network namespace"
made+=("$probe")
ip -n "$probe" link add probe0 type bridge 2> /dev/null || skip "cannot make a bridge"
ip -n "$probe" link add probe1 type veth peer name probe2 2> /dev/null || skip "cannot make a veth pair"
tc -n "$probe" qdisc add dev probe1 root tbf rate 1mbit burst 32kb latency 50ms 2> /dev/null ||
  skip "cannot add a tbf qdisc"
ip netns delete "$probe"
made=()

# A token bucket deep enough for the rate: 5 ms of traffic, at least 64 KiB (one GSO
# segment), so that the bucket rather than its depth sets the rate.
burst=$((bits_per_second / 8 / 200))
((burst >= 65536)) || burst=65536
limit_link() {  # namespace device
  tc -n "$1" qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency 100ms
}

ip netns add "$switch"
made+=("$switch")
ip -n "$switch" link add br0 type bridge
ip -n "$switch" link set br0 up
for ((r = 0; r < ranks; ++r)); do
  ns=$(rank_ns "$r")
  ip netns add "$ns"
  made+=("$ns")
  # Made in the switch's namespace, one end moved into the rank's: no name ever appears
  # in the machine's own namespace.
  ip -n "$switch" link add "p$r" type veth peer name eth0 netns "$ns"
  ip -n "$switch" link set "p$r" master br0 up
  ip -n "$ns" addr add "$(address "$r")/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  limit_link "$ns" eth0          # rank -> switch
  limit_link "$switch" "p$r"     # switch -> rank
done
echo "cluster: $ranks ranks at $(address 0)..$(address $((ranks - 1))), links $rate each way (tbf, no added delay)," \
     "namespaces $tag-*"

if ((check)); then
  ((ranks >= 2)) || { echo "cluster.sh: --check needs at least 2 ranks" >&2; exit 2; }
  # Rank 1 sends to rank 0 for about 2 s of the link; the receiver times from its first
  # byte past the bucket's depth to its last, so the burst does not count.
  total=$((bits_per_second / 8 * 2))
  ((total >= 4 * burst)) || total=$((4 * burst))
  measured=$(timeout 60 ip netns exec "$(rank_ns 0)" /usr/bin/python3 - "$(address 0)" "$total" "$burst" \
             "$(rank_ns 1)" <<'EOF'
import socket, subprocess, sys, time
host, total, burst, sender_ns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
server = socket.create_server((host, 0))
port = server.getsockname()[1]
send = ("import socket, sys\n"
        "s = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
        "block = bytes(1 << 20); left = int(sys.argv[3])\n"
        "while left > 0:\n"
        "    left -= s.send(block[:min(left, len(block))])\n"
        "s.close()\n")
sender = subprocess.Popen(["ip", "netns", "exec", sender_ns, "/usr/bin/python3", "-c", send, host, str(port),
                           str(total)])
conn, _ = server.accept()
got, start, counted = 0, None, 0
while True:
    chunk = conn.recv(1 << 20)
    if not chunk:
        break
    got += len(chunk)
    if start is None and got >= 2 * burst:
        start, counted = time.perf_counter(), got
end = time.perf_counter()
sender.wait()
if got != total or start is None or end <= start:
    sys.exit(f"received {got} of {total} bytes")
print(int((got - counted) * 8 / (end - start)))
EOF
  ) || { echo "cluster.sh: the rate check's transfer failed" >&2; exit 1; }
  /usr/bin/python3 - "$measured" "$bits_per_second" "$rate" <<'EOF'
import sys
measured, wanted, rate = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ratio = measured / wanted
print(f"cluster: measured {measured / 1e6:.1f} Mbit/s from rank 1 to rank 0 on a {rate} link ({ratio:.3f} of it)")
if abs(ratio - 1) > 0.10:
    sys.exit(f"cluster.sh: the link runs at {ratio:.3f} of {rate}, outside 10%: the emulation does not hold here")
EOF
fi

((${#command[@]})) || exit 0
port=$((20000 + $$ % 20000))
for ((r = 0; r < ranks; ++r)); do
  # setsid: each rank's processes form a group the cleanup can stop as one.
  setsid ip netns exec "$(rank_ns "$r")" env RANK="$r" LOCAL_RANK="$r" WORLD_SIZE="$ranks" \
    MASTER_ADDR="$(address 0)" MASTER_PORT="$port" GLOO_SOCKET_IFNAME=eth0 \
    timeout --kill-after=10 "$limit" "${command[@]}" &
  pids+=($!)
done
# The first rank that fails ends the run (the cleanup stops the others, which would
# otherwise wait for it until the timeout); else every rank's success.
running=("${pids[@]}")
while ((${#running[@]})); do
  status=0
  wait -n -p finished "${running[@]}" || status=$?
  ((status == 0)) || { echo "cluster.sh: a rank exited with status $status; stopping the others" >&2; exit "$status"; }
  for i in "${!running[@]}"; do [[ ${running[$i]} == "$finished" ]] && unset 'running[i]'; done
done
pids=()
