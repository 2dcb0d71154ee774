#!/bin/sh
# usage: two_namespaces.sh CKPT_BINARY WORK_DIR
# Two ranks of `ckpt train` in two network namespaces joined by a veth pair, as two hosts would be
# (10.77.0.1 and 10.77.0.2, nothing else reachable): the rendezvous and Gloo must go over the
# veth, not the loopback. Exits 77 (skipped) where namespaces can't be made: no root, no
# CAP_SYS_ADMIN, no `ip`. Every wait is bounded by `timeout`.
set -u
ckpt="$1"; work="$2"
command -v ip >/dev/null 2>&1 || { echo "skipped: no ip command"; exit 77; }
a="ckpt_a_$$"; b="ckpt_b_$$"
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; }
trap cleanup EXIT
if ! ip netns add "$a" 2>/dev/null || ! ip netns add "$b" 2>/dev/null ||
   ! ip link add "va$$" netns "$a" type veth peer name "vb$$" netns "$b" 2>/dev/null; then
  echo "skipped: this machine does not allow creating network namespaces and veth pairs"
  exit 77
fi
ip -n "$a" addr add 10.77.0.1/24 dev "va$$" && ip -n "$b" addr add 10.77.0.2/24 dev "vb$$" &&
  ip -n "$a" link set "va$$" up && ip -n "$b" link set "vb$$" up &&
  ip -n "$a" link set lo up && ip -n "$b" link set lo up || exit 1
rm -rf "$work" && mkdir -p "$work"
tiny="train --layers 1 --width 16 --heads 2 --context 8 --batch 4 --steps 5 --threads 1"
rendezvous="--world-size 2 --master-addr 10.77.0.1 --master-port 29533"
OMP_NUM_THREADS=1 timeout 150 ip netns exec "$a" "$ckpt" $tiny $rendezvous --rank 0 \
  --strategy sequential:2 --json "$work/rank0.json" > "$work/rank0.txt" 2>&1 &
rank0=$!
OMP_NUM_THREADS=1 timeout 150 ip netns exec "$b" "$ckpt" $tiny $rendezvous --rank 1 \
  --strategy sequential:2 > "$work/rank1.txt" 2>&1
code1=$?
wait "$rank0"
code0=$?
cat "$work/rank0.txt" "$work/rank1.txt"
[ "$code0" -eq 0 ] && [ "$code1" -eq 0 ] || { echo "a rank failed: $code0 $code1"; exit 1; }
difference=$(sed -n 's/.*"max_loss_difference": *\([^,]*\),*/\1/p' "$work/rank0.json")
grep -q '"ranks": 2' "$work/rank0.json" || { echo "no \"ranks\": 2 in the JSON"; exit 1; }
awk -v d="$difference" 'BEGIN { exit !(d != "" && d + 0 <= 1e-5) }' ||
  { echo "max_loss_difference $difference above 1e-5"; exit 1; }
echo "two namespaces: loss curves within $difference"
