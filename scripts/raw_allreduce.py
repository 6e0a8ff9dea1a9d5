"""The manual way to measure all_reduce bandwidth: a bare torch.distributed loop, as users paste it (torchrun,
one process per GPU, or gloo on CPU). Prints one JSON line from rank 0: bytes, seconds per call, algbw, busbw.

With ``--ddp`` it then also trains what the validation's DDP check trains (the same small model, data, sampler and
4 epochs, DistributedDataParallel; its constructor imports torch._dynamo): the bare program doing the suite's DDP
work too, so that the two can be compared like for like.

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
    parser.add_argument("--ddp", action="store_true", help="then train as the validation's DDP check does")
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
    looped = time.time()
    if args.ddp:
        train(dev)
    if dist.get_rank() == 0:
        busbw = algbw * 2 * (world - 1) / world
        # When rank 0 and torchrun's agent started, when torch was imported, when the work was done (epoch s).
        times = {
            "agent_started": AGENT_STARTED,
            "started": STARTED,
            "imported": IMPORTED,
            "done": time.time(),
            **({"looped": looped} if args.ddp else {}),
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


def train(dev: str) -> None:
    """A few epochs of DDP on a small regression, as a user's first DDP script (and the DDP check) does."""
    # Imported here, as the check does: without --ddp the program imports torch alone.
    from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415
    from torch.utils.data import DataLoader, TensorDataset  # noqa: PLC0415
    from torch.utils.data.distributed import DistributedSampler  # noqa: PLC0415

    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(1024, 32, generator=gen)
    y = x @ torch.randn(32, 1, generator=gen)
    sampler = DistributedSampler(TensorDataset(x, y), shuffle=True, seed=7)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, sampler=sampler)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(dev)
    ddp = DistributedDataParallel(model, device_ids=[dev] if dev != "cpu" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.02)
    for epoch in range(4):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(xb.to(dev)), yb.to(dev)).backward()
            opt.step()
    dist.barrier()


if __name__ == "__main__":
    main()
