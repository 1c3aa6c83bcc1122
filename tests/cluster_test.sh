#!/usr/bin/env bash
# experiments/cluster.sh: the link runs at its rate (within 10%), ranks reach each other with
# the rendezvous variables set, and every namespace it made is gone afterwards: after
# success, after a rank's failure (which ends the others at once), after the timeout and
# after Ctrl-C. Exits 77 (skipped) where the script cannot make namespaces.
set -uo pipefail
cd "$(dirname "$0")/.."
cluster=experiments/cluster.sh
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Names of the run that printed $1 ("cluster: ... namespaces gcNNN-*").
tag_of() { sed -n 's/.*namespaces \(gc[0-9]*\)-\*.*/\1/p' <<< "$1" | head -n 1; }
left_behind() { ip netns list | awk '{print $1}' | grep -c "^$1-" || true; }
expect_clean() {  # what-ran output
  local tag
  tag=$(tag_of "$2")
  [[ -n $tag ]] || { fail "$1: the script did not say which namespaces it made"; return; }
  local n
  n=$(left_behind "$tag")
  ((n == 0)) || fail "$1: $n namespaces of $tag left behind"
}

# 1. The rate, and the variables and the network every rank sees.
out=$(bash "$cluster" --ranks 2 --rate 1gbit --check --timeout 60 -- /usr/bin/python3 -c '
import os, socket, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
assert world == 2 and os.environ["LOCAL_RANK"] == str(rank), os.environ
host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 0:
    server = socket.create_server((host, port))
    conn, peer = server.accept()
    assert conn.recv(16) == b"hello from 1", "wrong greeting"
    print("rank 0 heard rank 1 from", peer[0])
else:
    for _ in range(100):
        try:
            socket.create_connection((host, port)).sendall(b"hello from 1")
            break
        except ConnectionRefusedError:
            time.sleep(0.1)
' 2>&1)
rc=$?
echo "$out"
if ((rc == 77)); then
  echo "SKIPPED: $(tail -n 1 <<< "$out")"
  exit 77
fi
((rc == 0)) || fail "the rate check and a greeting between two ranks exited with $rc"
grep -q "rank 0 heard rank 1 from 198.18.0.2" <<< "$out" || fail "rank 0 did not hear rank 1 at its address"
grep -q "measured .* of it)" <<< "$out" || fail "no measured rate printed"
expect_clean "a run that succeeded" "$out"

# 2. A rank that fails ends the run at once with its status; its peer is stopped.
start=$SECONDS
out=$(bash "$cluster" --ranks 3 --rate 100mbit --timeout 100 -- \
      bash -c '[[ $RANK == 1 ]] && exit 3; sleep 90' 2>&1)
rc=$?
((rc == 3)) || fail "a failing rank: exit status $rc, not 3"
((SECONDS - start < 30)) || fail "a failing rank: the others ran on for $((SECONDS - start)) s"
expect_clean "a run where a rank failed" "$out"

# 3. The timeout bounds every rank.
out=$(bash "$cluster" --ranks 2 --rate 100mbit --timeout 2 -- sleep 60 2>&1)
rc=$?
((rc == 124)) || fail "the timeout: exit status $rc, not 124"
expect_clean "a run that timed out" "$out"

# 4. Ctrl-C (SIGINT to the script) removes everything.
# Job control on while it starts: a non-interactive shell starts background jobs with
# SIGINT ignored, which no trap can undo; a terminal's Ctrl-C reaches a foreground one.
log=$(mktemp)
set -m
bash "$cluster" --ranks 2 --rate 100mbit --timeout 100 -- sleep 90 > "$log" 2>&1 &
pid=$!
set +m
for _ in $(seq 100); do grep -q "namespaces gc" "$log" && break; sleep 0.1; done
sleep 0.5
kill -INT "$pid"
wait "$pid"
rc=$?
((rc == 130)) || fail "Ctrl-C: exit status $rc, not 130"
expect_clean "a run stopped by Ctrl-C" "$(cat "$log")"
rm -f "$log"

# 5. Bad arguments are named.
out=$(bash "$cluster" --ranks 0 -- true 2>&1)
(($? == 2)) && grep -q -- "--ranks must be in \[1, 200\], got '0'" <<< "$out" || fail "--ranks 0: $out"
out=$(bash "$cluster" --rate fast -- true 2>&1)
(($? == 2)) && grep -q -- "--rate .* got 'fast'" <<< "$out" || fail "--rate fast: $out"

((failures == 0)) && echo "cluster: all checks passed"
((failures == 0))
