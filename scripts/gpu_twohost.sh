#!/usr/bin/env bash
# Two hosts on one GPU machine (issue 21, item 5): each "host" is a UTS namespace of its own (`unshare --uts`, its
# own host name and NCCL_HOSTID) that sees one GPU, and runs one torchrun agent, as srun starts one per node. The
# agents meet at a c10d rendezvous on the loopback address, and NCCL, seeing two hosts, goes between them through
# its network transport (sockets on `lo`) instead of NVLink. The rank program is envbuilder's validation payload
# (import, gpu, nccl sweep, ddp); the script prints each rank's results and the transports NCCL chose.
# Needs an env with CUDA torch (default: the one scripts/gpu_validate.sh creates). Results go to $OUT (or
# ./gpu-twohost). Keep NVLink multicast off (the NCCL_NVLS_ENABLE family below) on the lent machines.
set -uo pipefail
out=${OUT:-gpu-twohost}
py=${ENV_PYTHON:-/tmp/envs/gpu-overlay/bin/python}
payload=$PWD/envbuilder/payloads/validate.py
port=${PORT:-29511}
# DEVICE=cpu tries the same two hosts on a machine without GPUs (gloo between them).
if [ "${DEVICE:-cuda}" = cpu ]; then
  args=(--checks import,nccl,ddp --device cpu)
else
  args=(--checks import,gpu,nccl,ddp --device cuda --expect-gpus 1)
fi
mkdir -p "$out"
export NO_COLOR=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET

# Each host resolves both names (torchrun hands the ranks their agent's host name as MASTER_ADDR): a hosts file of
# the pair, bound over /etc/hosts in each host's own mount namespace; distinct loopback addresses, as on the tests'
# multi-node bed.
printf '127.0.0.1 localhost\n127.0.1.1 h1\n127.0.1.2 h2\n' > "$out/hosts"
trap 'pkill -f -- "--rdzv-id=twohost" 2> /dev/null' EXIT

host() { # NAME GPU: one node's agent, in UTS and mount namespaces of its own, that sees GPU only
  unshare --uts --mount --fork --kill-child bash -c 'mount --bind "$7" /etc/hosts && hostname "$1" &&
    exec env NCCL_HOSTID="$1" CUDA_VISIBLE_DEVICES="$2" "$3" \
    -m torch.distributed.run --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint="127.0.0.1:$4" \
    --rdzv-id=twohost "$5" --out "$6" --timeout 180 "${@:8}"' \
    host "$1" "$2" "$py" "$port" "$payload" "$out/ranks" "$out/hosts" "${args[@]}"
}

start=$EPOCHREALTIME
host h1 0 > "$out/h1.log" 2>&1 &
first=$!
host h2 1 > "$out/h2.log" 2>&1 &
second=$!
wait "$first"
rc1=$?
wait "$second"
rc2=$?
echo "twohost rc=$rc1,$rc2 wall=$(python3 -c "print(round($EPOCHREALTIME - $start, 2))")s"

python3 - "$out/ranks" << 'EOF'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("rank-*.jsonl")):
    hello = {}
    for line in path.read_text().splitlines():
        event = json.loads(line)
        hello = hello or (event if event.get("event") != "result" else {})
        if event.get("event") == "result":
            figures = {k: v.get("value") for k, v in (event.get("figures") or {}).items()}
            print(f"{path.stem} {event['check']:8s} {event['status']:5s} {figures} {event.get('cause', '')}")
    print(f"{path.stem} first event: {json.dumps(hello)[:300]}")
EOF
echo "NCCL transports between the hosts (h1's log):"
grep -ho "via NET/[A-Za-z]*[^ ]*\|via P2P[^ ]*\|via SHM[^ ]*\|NET/Socket : Using[^\n]*" "$out/h1.log" | sort | uniq -c | head
grep -h "Bootstrap\|hostHash\|nNodes" "$out/h1.log" | head -5
