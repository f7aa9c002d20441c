#!/usr/bin/env bash
# The MPI exchanges under SimGrid's SMPI at 16 simulated ranks (bench/smpi_exchange.cpp, small
# N): every rank applies the same update; the bytes each rank hands its collectives are what
# the formats say (dense: a ring's 2 (P - 1) / P of 4N; all-gather: P - 1 payloads; reduce:
# 2 (P - 1) blocks; at exact sizes no more, in two hops fewer still, and fewer again with compact
# values; the all-gather's compact8 payloads under half the plain ones) and the reduce
# exchange's stay under the all-gather's; the reduce exchange applies its target (within 5%)
# on iid gradients; simulated time is positive; both platforms of bench/smpi/ load; the alpha-beta model
# (bench/smpi_model.py) is within 25% of the simulated time of the dense all-reduce and of
# the two hops; a step that fails on one rank raises the same error on every rank, none waiting;
# a bad argument ends every rank with status 2 and its reason once.
#   smpi_test.sh SMPIRUN PROGRAM SOURCE_ROOT
set -euo pipefail
smpirun=$1 program=$2 root=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 0 15); do echo "node-$i"; done > "$work/hosts"
for platform in 10gbps 100gbps; do
  for mode in dense allgather allgather-compact8 reduce reduce-exact reduce-two-hop reduce-two-hop-compact; do
    "$smpirun" -np 16 -platform "$root/bench/smpi/cluster-$platform.xml" -hostfile "$work/hosts" \
      --cfg=smpi/coll-selector:ompi --cfg=smpi/simulate-computation:no --log=root.thres:critical \
      "$program" --mode "$mode" --gradient iid --n 16384 --density 0.01 --warmup 1 --steps 3 --method top-k \
      | tail -1 | sed "s/}\$/, \"platform\": \"$platform\"}/" >> "$work/runs.jsonl"
  done
done
cat "$work/runs.jsonl"
# A step that fails on the last rank (its compress throws, or its wait() gets a dense one value
# short): every rank's wait() throws the same sentence naming it, no dense is written, none
# waits, and the steps after it apply the same bits everywhere.
for failing in "reduce-two-hop dense 2" "reduce compress 2" "allgather compress 1"; do
  set -- $failing
  "$smpirun" -np 16 -platform "$root/bench/smpi/cluster-10gbps.xml" -hostfile "$work/hosts" \
    --cfg=smpi/coll-selector:ompi --cfg=smpi/simulate-computation:no --log=root.thres:critical \
    "$program" --mode "$1" --fail-how "$2" --fail-step "$3" --gradient iid --n 16384 --density 0.01 --warmup 1 \
    --steps 3 --method top-k | tail -1 >> "$work/failures.jsonl"
done
cat "$work/failures.jsonl"
/usr/bin/python3 - "$work/failures.jsonl" <<'PY'
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
assert [(r["mode"], r["how"]) for r in runs] == [("reduce-two-hop", "dense"), ("reduce", "compress"),
                                                ("allgather", "compress")], runs
for r in runs:
    what = f"{r['mode']}, rank 15's {r['how']} failing at step {r['failed_step']}"
    if not (r["raised"] == 16 and r["same_error"] and r["dense_kept"]):
        sys.exit(f"smpi_test: {what}: {r['raised']} of 16 ranks raised, the same sentence: {r['same_error']}, "
                 f"dense kept: {r['dense_kept']}")
    if "rank 15 failed" not in r["error"] or not r["identical"]:
        sys.exit(f"smpi_test: {what}: {r['error']!r}, the later steps alike on every rank: {r['identical']}")
print("smpi_test: 3 failed steps raised alike on all 16 ranks")
PY
# Arguments every rank refuses alike: exit status 2 and the reason once, not an abort that
# SMPI reports as a deadlock (with status 0).
for refused in "--mode bogus:--mode bogus is not" "--mode allgather --fail-step 1 --fail-how dense:--fail-how dense needs a reduce mode"; do
  status=0
  "$smpirun" -np 16 -platform "$root/bench/smpi/cluster-10gbps.xml" -hostfile "$work/hosts" \
    --cfg=smpi/simulate-computation:no --log=root.thres:critical "$program" ${refused%%:*} \
    > /dev/null 2> "$work/refused.txt" || status=$?
  if [ "$status" != 2 ] || [ "$(grep -c -- "${refused#*:}" "$work/refused.txt")" != 1 ] ||
     grep -q -i deadlock "$work/refused.txt"; then
    echo "smpi_test: '${refused%%:*}' exited with status $status, not 2 with its reason once:" >&2
    cat "$work/refused.txt" >&2
    exit 1
  fi
done
/usr/bin/python3 - "$work/runs.jsonl" <<'PY'
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
assert len(runs) == 14, runs
def fail(why):
    sys.exit(f"smpi_test: {why}")
for r in runs:
    if not r["identical"]:
        fail(f"{r['mode']} on {r['platform']}: ranks applied different updates")
    if not r["sim_ms"] > 0:
        fail(f"{r['mode']} on {r['platform']}: no simulated time")
by = {(r["mode"], r["platform"]): r for r in runs}
p, n = 16, 16384
k = int(0.01 * n)
capacity = -(-int(1.25 * k * 100) // (100 * p))  # ceil(1.25 k / P)
block = max(64 + (capacity * 4 + 7) // 8 * 8 * 2, 64 + 256)
payload = max(64 + (int(-(-1.25 * k // 1)) * 4 + 7) // 8 * 8 * 2, 64 + 256)
expected = {"dense": 2 * (p - 1) / p * 4 * n, "allgather": (p - 1) * payload, "reduce": 2 * (p - 1) * block}
for (mode, platform), r in by.items():
    if mode in expected and abs(r["bytes_per_rank"] - expected[mode]) > 1:
        fail(f"{mode} on {platform}: {r['bytes_per_rank']} bytes per rank, the format says {expected[mode]}")
for platform in ("10gbps", "100gbps"):
    if not by["reduce", platform]["bytes_per_rank"] < by["allgather", platform]["bytes_per_rank"]:
        fail(f"reduce sends no less than the all-gather at {p} ranks on {platform}")
    if not 0.95 <= by["reduce", platform]["applied_p5"] <= 1.05:
        fail(f"reduce applied {by['reduce', platform]['applied_p5']} of its target on iid gradients")
    exact, fixed = by["reduce-exact", platform], by["reduce", platform]
    if not exact["bytes_per_rank"] < fixed["bytes_per_rank"]:
        fail(f"reduce at exact sizes sends {exact['bytes_per_rank']} bytes per rank, at the fixed size {fixed['bytes_per_rank']}")
    if exact["applied_median"] != fixed["applied_median"]:
        fail(f"reduce at exact sizes applied {exact['applied_median']} of its target, at the fixed size {fixed['applied_median']}")
    hops = by["reduce-two-hop", platform]
    if hops["applied_median"] != fixed["applied_median"]:
        fail(f"reduce in two hops applied {hops['applied_median']} of its target, flat {fixed['applied_median']}")
    if not hops["bytes_per_rank"] < exact["bytes_per_rank"]:
        fail(f"reduce in two hops sends {hops['bytes_per_rank']} bytes per rank, flat at exact sizes {exact['bytes_per_rank']}")
    bytes8, plain = by["allgather-compact8", platform], by["allgather", platform]
    if not bytes8["bytes_per_rank"] < plain["bytes_per_rank"] / 2:
        fail(f"the all-gather in compact8 sends {bytes8['bytes_per_rank']} bytes per rank, "
             f"plain {plain['bytes_per_rank']}")
    compact = by["reduce-two-hop-compact", platform]
    if not compact["bytes_per_rank"] < hops["bytes_per_rank"]:
        fail(f"compact two hops send {compact['bytes_per_rank']} bytes per rank, plain {hops['bytes_per_rank']}")
    if not 0.95 <= compact["applied_p5"] <= 1.05:
        fail(f"compact two hops applied {compact['applied_p5']} of their target on iid gradients")
print("smpi_test: 14 runs as the formats say")
PY
# The alpha-beta model with SMPI's message-size factors predicts the dense all-reduce and the
# two-hop exchange within 25% (bench/smpi_model.py).
/usr/bin/python3 "$root/bench/smpi_model.py" "$work/runs.jsonl" --platforms "$root/bench/smpi" --check 0.25
