"""The manual way to measure all_reduce bandwidth: a bare torch.distributed loop, as users paste it (torchrun,
one process per GPU, or gloo on CPU). Prints one JSON line from rank 0: bytes, seconds per call, algbw, busbw.

Timing matches what the validation payload reports: warm-up calls, then the mean of a timed loop, the slowest
rank's value, busbw = algbw * 2(n-1)/n as nccl-tests defines it. The line also says when rank 0 and torchrun's
agent started, when torch was imported and when the loop was done (epoch seconds): scripts/bench_validate.py
splits the program's wall time into parts with them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def started_at(pid: int) -> float | None:
    """When process ``pid`` started, in epoch seconds (to a clock tick); None where /proc does not tell."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
        uptime = float(Path("/proc/uptime").read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return None
    ticks = int(data[data.rfind(b")") + 2 :].split()[19])
    return round(time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK"), 3)


STARTED = started_at(os.getpid())
AGENT_STARTED = started_at(os.getppid())

import torch  # noqa: E402  (timed: the start-up above is taken before it)
import torch.distributed as dist  # noqa: E402

IMPORTED = time.time()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, default=1 << 30)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local)
        dev = f"cuda:{local}"
        dist.init_process_group("nccl")
    else:
        dev = "cpu"
        dist.init_process_group("gloo")
    world = dist.get_world_size()
    t = torch.ones(args.bytes // 4, dtype=torch.float32, device=dev)

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize(dev)

    for _ in range(3):
        dist.all_reduce(t)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(t)
    sync()
    elapsed = torch.tensor([(time.perf_counter() - t0) / args.iters], dtype=torch.float64, device=dev)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    seconds = elapsed.item()
    algbw = args.bytes / seconds / 1e9
    if dist.get_rank() == 0:
        busbw = algbw * 2 * (world - 1) / world
        # When rank 0 and torchrun's agent started, when torch was imported, when the work was done (epoch s).
        times = {
            "agent_started": AGENT_STARTED,
            "started": STARTED,
            "imported": IMPORTED,
            "done": time.time(),
        }
        print(
            json.dumps(
                {
                    "bytes": args.bytes,
                    "seconds": seconds,
                    "algbw": algbw,
                    "busbw": busbw,
                    "world": world,
                    **times,
                }
            )
        )
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
