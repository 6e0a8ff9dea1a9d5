"""A small DDP training program for `envbuilder run` (scripts/gpu_validate.sh runs it on the GPU node): a
regression model trained for a few epochs on synthetic data with DistributedSampler, NCCL on GPUs and gloo
on CPU. Under torchrun it reads torchrun's variables; under an MPI launcher, the launcher's (Open MPI, PMI).
It prints one line per rank and exits non-zero if the loss did not go down or the ranks' weights differ."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

_RANK_VARS = (
    ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"),
    ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
)
_LOCAL = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK")


def _first(names: tuple[str, ...], default: str) -> str:
    return next((os.environ[n] for n in names if n in os.environ), default)


def main() -> int:
    os.environ.setdefault("RANK", _first(_RANK_VARS[0], "0"))
    os.environ.setdefault("WORLD_SIZE", _first(_RANK_VARS[1], "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    local = int(_first(_LOCAL, "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x = torch.randn(4096, 32)
    y = x @ torch.randn(32, 1) + 0.1 * torch.randn(4096, 1)
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank)
    model = DistributedDataParallel(
        torch.nn.Linear(32, 1).to(device), device_ids=[device.index] if cuda else None
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for epoch in range(5):
        sampler.set_epoch(epoch)
        total = 0.0
        for xb, yb in DataLoader(data, batch_size=128, sampler=sampler):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb.to(device)), yb.to(device))
            loss.backward()
            opt.step()
            total += loss.item()
        losses.append(total)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    same = all(torch.equal(gathered[0], w) for w in gathered)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    line = (
        f"rank {rank}/{world} {device} ({name}) loss {losses[0]:.3f} -> {losses[-1]:.3f} "
        f"same_weights={same} omp={os.environ.get('OMP_NUM_THREADS')} cpus={sorted(os.sched_getaffinity(0))[:4]}..."
    )
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    dist.barrier()  # no rank tears gloo down while another still talks to it (it aborted at exit, 1 run in 10)
    dist.destroy_process_group()
    return 0 if same and losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
