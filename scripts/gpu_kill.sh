#!/usr/bin/env bash
# Killing `envbuilder validate` on a real GPU node (the lent 2x H200 machine, which has no network) frees the GPUs
# within seconds. A venv with the node's CUDA torch (repacked as wheels, as scripts/gpu_guard.sh does) runs a
# 2-GPU validation whose rank 1 hangs as the nccl check starts (rank 0 then waits in the NCCL rendezvous); both
# ranks hold a CUDA context from the cuda check. Once `nvidia-smi` lists both, envbuilder is killed (SIGKILL, then
# SIGTERM in a second run, then SIGKILL of an mpirun run where mpirun exists), and `nvidia-smi` is polled until it
# lists no process: the seconds that took, and those until no process of the run (found by a token in its
# environment) was left, are printed. Before the fix the ranks held the GPUs until their own timeout.
# Results go to $OUT (or ./gpu-kill): summary.txt, create.err, one run-*.txt per run. VALIDATE_ARGS adds
# arguments to each validate (VALIDATE_ARGS=--cpu tries the script out on a machine without GPUs); RUNS picks the
# runs (default "torchrun:SIGKILL torchrun:SIGTERM mpirun:SIGKILL").
set -uo pipefail
out=${OUT:-gpu-kill}
mkdir -p "$out"
. "$(dirname "$0")/gpu_common.sh"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NO_COLOR=1 PYTHONUNBUFFERED=1 COLUMNS=160
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ENVBUILDER_HOME=/tmp/eb-kill-home SCRATCH=/tmp/eb-kill-scratch ENVBUILDER_RECIPE_PATH=/tmp/eb-kill-recipes
mkdir -p "$SCRATCH" "$ENVBUILDER_RECIPE_PATH"
summary=$out/summary.txt
: > "$summary"

node_torch
echo "node torch: $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count(), "GPUs")')" | tee -a "$summary"
echo "GPU processes before: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)" | tee -a "$summary"
[ -d /tmp/wheels-cu130 ] || python3 scripts/repack_wheels.py "$node_env" /tmp/wheels-cu130 > /dev/null

cat > "$ENVBUILDER_RECIPE_PATH/gpu-kill.toml" <<EOF
schema_version = 1
[recipe]
name = "gpu-kill"
description = "venv with the node's CUDA torch from its (local) index, validated and killed"
[env]
kind = "venv"
installer = "uv"
prefix = "\${SCRATCH}/envs/{name}"
[python]
command = "python3"
[torch]
version = "$torch_version"
variant = "auto"
packages = ["torch"]
[launcher]
gpu_affinity = "local-rank"
EOF
s=$EPOCHREALTIME
ENVBUILDER_INDEX_MIRROR="https://download.pytorch.org/whl/=/tmp/wheels-cu130 pypi=/tmp/wheels-cu130" \
  python3 -m envbuilder create gpu-kill --no-validate > /dev/null 2> "$out/create.err"
echo "create rc=$? wall=$(python3 -c "print(round($EPOCHREALTIME - $s, 1))")s" | tee -a "$summary"

# kill_run LAUNCHER SIGNAL: start the validation, wait until both ranks hold a GPU and sit in the nccl check, send the signal to
# envbuilder alone, then poll nvidia-smi and /proc.
kill_run() {
  python3 - "$SCRATCH/envs/gpu-kill" "$2" "$1" "$out/run-$1-$2.txt" <<'PY' | tee -a "$summary"
import json, os, shutil, signal, subprocess, sys, time, uuid
from pathlib import Path

prefix, sig_name, launcher, log_path = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
sig = getattr(signal, sig_name)
token = uuid.uuid4().hex
beat = Path(f"/tmp/eb-kill-beat-{token}")
beat.mkdir()
log = log_path.open("w")


def say(text):
    log.write(text + "\n")
    log.flush()


def gpu_pids():
    res = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True
    )
    return [line.strip() for line in res.stdout.splitlines() if line.strip()]


def tree():
    """Live processes carrying this run's token: pid -> command."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"EB_KILL_TOKEN={token}".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_bytes()
            if stat[stat.rfind(b")") + 2 :].split()[0] in (b"Z", b"X"):
                continue
            found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
        except OSError:
            continue
    return found


def events():
    out = {}
    for path in prefix.glob(f"envbuilder/validation/run-*-{proc.pid}/ranks/rank-*.jsonl"):
        out[path.name] = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return out


def in_nccl(evs):
    return sum(any(e["event"] == "start" and e.get("check") == "nccl" for e in rank) for rank in evs.values())


env = {
    **os.environ,
    "EB_KILL_TOKEN": token,
    "ENVBUILDER_VALIDATE_HEARTBEAT": str(beat),
    "ENVBUILDER_VALIDATE_FAULT": "1:nccl:hang",
}
argv = [sys.executable, "-m", "envbuilder", "validate", "gpu-kill", "--launcher", launcher]
argv += ["--checks", "import,gpu,cuda,nccl", "--timeout", "600", *os.environ.get("VALIDATE_ARGS", "").split()]
err = Path(f"/tmp/eb-kill-{token}.out").open("w")
t_start = time.monotonic()
proc = subprocess.Popen(argv, env=env, stdout=err, stderr=subprocess.STDOUT, start_new_session=True)
say(f"+ {' '.join(argv)}  (pid {proc.pid})")
up = False
while time.monotonic() - t_start < 420 and proc.poll() is None:
    if len(gpu_pids()) >= 2 and in_nccl(events()) >= 2:
        up = True
        break
    time.sleep(0.5)
if not up:
    proc.kill()
    proc.wait()
    err.close()
    say(f"not up (validate exit {proc.returncode}); its output:")
    say(Path(err.name).read_text()[-3000:])
    print(f"{launcher} {sig_name}: the ranks never came up (see {log_path.name})")
    shutil.rmtree(beat, ignore_errors=True)
    sys.exit(0)
time.sleep(2)  # rank 0 into the NCCL rendezvous
before = tree()
say(f"up after {time.monotonic() - t_start:.1f} s; GPU processes {gpu_pids()}; processes of the run:")
for pid, cmd in sorted(before.items()):
    say(f"  {pid} {cmd}")
t0 = time.monotonic()
os.kill(proc.pid, sig)
t_gpu = t_tree = None
while time.monotonic() - t0 < 120 and (t_gpu is None or t_tree is None):
    now = time.monotonic() - t0
    if t_gpu is None and not gpu_pids():
        t_gpu = now
    if t_tree is None and not tree():
        t_tree = now
    time.sleep(0.1)
code = proc.wait()
err.close()
say(f"envbuilder exit {code}; its output (last lines):")
say(Path(err.name).read_text()[-1500:])
os.unlink(err.name)
left = tree()
if left:
    say(f"SURVIVORS after 120 s: {left}")
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


shutil.rmtree(beat, ignore_errors=True)


def fmt(t):
    return f"{t:.1f} s" if t is not None else "NOT within 120 s"


print(
    f"{launcher} {sig_name}: GPUs free after {fmt(t_gpu)}, every process of the run gone after {fmt(t_tree)} "
    f"({len(before)} processes, envbuilder exit {code})"
)
PY
}

for run in ${RUNS:-torchrun:SIGKILL torchrun:SIGTERM mpirun:SIGKILL}; do
  if [ "${run%%:*}" = mpirun ] && ! command -v mpirun > /dev/null; then
    echo "mpirun: not on PATH, skipped" | tee -a "$summary"
    continue
  fi
  kill_run "${run%%:*}" "${run#*:}"
done
echo "GPU processes after: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)" | tee -a "$summary"
