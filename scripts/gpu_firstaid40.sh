#!/usr/bin/env bash
# Issue 40 on a real GPU node (the lent 2x H200 machine, no network): real failure logs for `envbuilder explain`
# made by the node's CUDA torch (CUDA out of memory, an NCCL collective timeout, NCCL told to use a network
# interface or a network plugin the node does not have, the loader missing a CUDA 12 runtime in a CUDA 13 env, no
# kernel image for the GPU's arch), the node's topology for the NIC-locality check (scripts/capture_topology.sh),
# then `envbuilder explain` on each log. ONLY="name ..." records only those logs and skips the topology.
# Results in $OUT (or ./gpu-firstaid40): failures.tar.gz (each log with a header saying how it was made),
# explain.txt, topology (capture_topology.sh's tar), summary.txt.
set -uo pipefail
out=${OUT:-gpu-firstaid40}
mkdir -p "$out"
logs=$(mktemp -d "${TMPDIR:-/tmp}/eb-fail40-XXXXXX")
export NO_COLOR=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. "$(dirname "$0")/gpu_common.sh"
node_torch
record() {  # record NAME WHAT CMD...: the command's output (both streams) under a header naming how it was made
  local name=$1 what=$2
  shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  {
    echo "# recorded $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1 | tr -d '\n'), torch $(python3 -c 'import torch; print(torch.__version__)')"
    echo "# what: $what"
    echo "# command: $*"
    echo "# ----"
  } > "$logs/$name.log"
  timeout "${RECORD_TIMEOUT:-45}" "$@" >> "$logs/$name.log" 2>&1
  echo "$name rc=$?" | tee -a "$out/steps.txt"
}
cat > "$logs/collective.py" <<'PY'
import datetime, os, sys, time
import torch, torch.distributed as dist
rank = int(os.environ["RANK"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=float(os.environ.get("WAIT", "600"))))
x = torch.ones(1 << 20, device="cuda")
if sys.argv[1:] == ["hang"] and rank == 1:
    time.sleep(40)  # rank 1 never joins the collective: rank 0's watchdog times out
dist.all_reduce(x)
torch.cuda.synchronize()
print("rank", rank, "sum", x[0].item())
PY
tr="python3 -m torch.distributed.run --standalone --nproc-per-node 2"
record cuda-oom "a tensor larger than the GPU's memory" python3 -c "import torch; torch.empty(400 * 2**30, dtype=torch.uint8, device='cuda')"
record nccl-timeout "rank 1 never joins an all_reduce; process group timeout 10 s" env WAIT=10 $tr "$logs/collective.py" hang
record nccl-ifname "NCCL_SOCKET_IFNAME names an interface the node lacks, InfiniBand off" env NCCL_SOCKET_IFNAME==nosuchif0 NCCL_IB_DISABLE=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=WARN $tr "$logs/collective.py"
record nccl-net-plugin "NCCL_NET names the AWS OFI plugin, which the node lacks" env NCCL_NET="AWS Libfabric" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=WARN $tr "$logs/collective.py"
record cudart12-missing "the loader asked for the CUDA 12 runtime in a CUDA 13 env (as an extension built for CUDA 12 does)" python3 -c "import torch, ctypes; print(torch.version.cuda); ctypes.CDLL('libcudart.so.12')"
# A wheel without the GPU's architecture, made on a GPU whose arch the node's wheel has: CUDA_FORCE_PTX_JIT=1 makes
# the driver ignore every kernel's machine code and JIT-compile its PTX instead; torch ships PTX only for its newest
# arch, which a Hopper cannot run, so each kernel launch fails as it does where the wheel lacks the arch.
record no-kernel-image "CUDA_FORCE_PTX_JIT=1: the driver may use only PTX, and the wheel's PTX is for a newer arch than the GPU's" env CUDA_FORCE_PTX_JIT=1 python3 -c "import torch; print(torch.cuda.get_arch_list()); x = torch.ones(4, device='cuda'); print((x * 2).sum().item())"
record no-kernel-image-ddp "the same under torchrun, two ranks, NCCL" env CUDA_FORCE_PTX_JIT=1 $tr "$logs/collective.py"
rm -f "$logs/collective.py"
tar -C "$logs" -czf "$out/failures.tar.gz" .
if [ -z "${ONLY:-}" ] && [ -f scripts/capture_topology.sh ]; then
  step topology bash scripts/capture_topology.sh
fi
for f in "$logs"/*.log; do
  echo "== $(basename "$f")"
  PYTHONPATH=$PWD python3 -m envbuilder explain "$f" 2>&1 | head -n 25
done > "$out/explain.txt" 2>&1
{ cat "$out/steps.txt"; for f in "$logs"/*.log; do echo "== $(basename "$f")"; grep -v "^# " "$f" | grep -iE "error|warn|fail|exitcode|cannot|timeout|timed out" | head -n 8; done; } > "$out/summary.txt"
cat "$out/summary.txt"
rm -rf "$logs" "$out"/*.err "$out"/*.out "$out/steps.txt"
