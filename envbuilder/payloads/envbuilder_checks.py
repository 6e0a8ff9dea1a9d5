"""The checks of the validation payload, and their pure helpers (unit-tested without torch).

Imported by ``validate.py`` from the same directory; every ``check_*`` method records one result through the
rank's log and returns it, and the methods are the payload's table of checks: envbuilder names them in
``envbuilder/core/checks.py`` (tests/unit/test_suite.py keeps the two in step). Standard library and torch
only (mpi4py and horovod when present).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import math
import os
import socket
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any, Optional

from envbuilder_facts import (
    accelerator,
    arch_gaps,
    bus_bandwidth,
    device_code,
    dist_backend,
    expected_gpus,
    fs_roundtrip,
    gfx_gaps,
    loaded_libraries,
    shadowed,
    shared_gpus,
    wheel_copies,
)
from envbuilder_site_checks import SiteChecks

GPU_CHECKS = ("gpu", "arch", "cuda")
DIST_CHECKS = ("nccl", "ddp")
#: The modules whose import order the mpi check records.
ORDERED_IMPORTS = ("mpi4py", "torch")

# --- faults (tests only) --------------------------------------------------------------------------------------


def faults(rank: int) -> dict[str, str]:
    out = {}
    for item in filter(None, os.environ.get("ENVBUILDER_VALIDATE_FAULT", "").split(",")):
        who, _, rest = item.partition(":")
        check, _, action = rest.partition(":")
        if who in (str(rank), "*"):
            out[check] = action
    return out


def inject(action: Optional[str], rank: int) -> None:
    if action == "exit":
        os._exit(17)
    if action == "hang":
        beat = os.environ.get("ENVBUILDER_VALIDATE_HEARTBEAT")
        while True:
            if beat:  # the rank's heartbeat, also where its lifeline watch has not started yet
                with contextlib.suppress(OSError):
                    with open(os.path.join(beat, f"rank-{rank}"), "a", encoding="utf-8"):
                        pass
                    os.utime(os.path.join(beat, f"rank-{rank}"))
            time.sleep(0.5)


def mpi_first(mpi_launched: bool, checks: Sequence[str], mpi4py_found: bool) -> bool:
    """Whether MPI starts (``from mpi4py import MPI``) before torch is imported: in ranks an MPI launcher started,
    with the mpi check to run and mpi4py in the env. Cray MPICH's GPU support must be initialised before CUDA is
    loaded, which importing torch does; other MPIs do not mind the order."""
    return mpi_launched and "mpi" in checks and mpi4py_found


def import_order(loaded: Iterable[str]) -> list[str]:
    """mpi4py and torch in the order this process imported them (``sys.modules`` keeps insertion order)."""
    return [name for name in loaded if name in ORDERED_IMPORTS]


# --- the checks -----------------------------------------------------------------------------------------------


class Suite(SiteChecks):
    def __init__(self, args: Any, log: Any, rank: Any) -> None:
        self.args = args
        self.log = log
        self.rank = rank
        self.torch: Any = None
        self.device = "cpu"
        #: The GPU stack of this torch ("cuda", "rocm", "xpu"; "" for a CPU build) and its device API
        #: (torch.cuda for CUDA and ROCm, whose HIP build keeps torch.cuda's names; torch.xpu for XPU).
        self.kind = ""
        self.api: Any = None
        self.dist_ready = False
        self.dist_broken: Optional[str] = None

    # import -------------------------------------------------------------------------------------------------

    def check_import(self) -> dict[str, Any]:
        checks = self.args.checks.split(",")
        if mpi_first(self.rank.mpi, checks, importlib.util.find_spec("mpi4py") is not None):
            # The mpi check imports it again and reports whatever went wrong here.
            with contextlib.suppress(Exception):
                from mpi4py import MPI  # noqa: F401
        t0 = time.perf_counter()
        try:
            import torch
        except Exception as exc:  # the record must say why, whatever it was
            return self.log.result(
                "import",
                "fail",
                cause=f"import torch failed: {type(exc).__name__}: {exc}",
                hint="is torch installed in this env? `envbuilder show ENV` lists its packages",
            )
        self.torch = torch
        seconds = time.perf_counter() - t0
        xpu = getattr(torch, "xpu", None)
        hip = getattr(torch.version, "hip", None)
        self.kind = accelerator(torch.version.cuda, hip, bool(xpu is not None and xpu.is_available()))
        self.api = (xpu if self.kind == "xpu" else torch.cuda) if self.kind else None
        if self.args.device == "cuda" and self.api is not None and self.api.is_available():
            count = self.api.device_count()
            prefix = "xpu" if self.kind == "xpu" else "cuda"
            self.device = f"{prefix}:{self.rank.local % count}" if count else "cpu"
        return self.log.result(
            "import",
            "pass",
            torch=torch.__version__,
            cuda=torch.version.cuda,
            hip=hip,
            stack=self.kind or "cpu",
            # envbuilder's resolver says the same in the plan (resolver/vendors.NEW_SUPPORT).
            **(
                {"note": "support for ROCm/XPU is new and has not run on such hardware here"}
                if self.kind in ("rocm", "xpu")
                else {}
            ),
            python=sys.version.split()[0],
            file=os.path.dirname(torch.__file__),
            figures={"import_s": {"value": round(seconds, 3), "unit": "s"}},
        )

    # gpu / arch / cuda --------------------------------------------------------------------------------------

    def check_gpu(self) -> dict[str, Any]:
        expected, source = expected_gpus(self.args.expect_gpus)
        count = self.api.device_count() if self.api is not None else 0
        devices = []
        for i in range(count):
            props = self.api.get_device_properties(i)
            devices.append(
                {
                    "name": props.name,
                    "capability": device_code(self.kind, props),
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "uuid": str(getattr(props, "uuid", "")),
                }
            )
        data: dict[str, Any] = {
            "count": count,
            "expected": expected,
            "promised_by": source,
            "devices": devices,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
        if expected is None or count == expected:
            if count == 0 and expected is None:
                return self.log.result("gpu", "skip", reason="no GPU visible, and none was promised", **data)
            return self.log.result("gpu", "pass", **data)
        cause, hint = self._gpu_cause(count, expected, source)
        return self.log.result("gpu", "fail", cause=cause, hint=hint, **data)

    def _gpu_cause(self, count: int, expected: int, source: str) -> tuple[str, str]:
        torch = self.torch
        promised = f"the {source} promises {expected} GPU(s) to this rank; torch sees {count}"
        if not self.kind:
            return (
                f"{promised}: this torch ({torch.__version__}) is a CPU build",
                "recreate the env on a GPU node, or pin torch.variant to a cuNNN, rocmX.Y or xpu build in the recipe",
            )
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        if cvd is not None and cvd.strip() in ("", "-1"):
            return f"{promised}: CUDA_VISIBLE_DEVICES={cvd!r} hides them", "unset CUDA_VISIBLE_DEVICES"
        if count == 0:
            try:
                self.api.init()
                why = f"{self.kind.upper()} initialised but found no device"
            except Exception as exc:  # the driver's own words are the cause
                why = f"{self.kind.upper()} cannot initialise: {exc}"
            tool = {"rocm": "amd-smi", "xpu": "xpu-smi or sycl-ls"}.get(self.kind, "nvidia-smi")
            return (
                f"{promised}: {why}",
                f"run on a GPU node of the allocation; check the driver with {tool}",
            )
        return promised, "request the GPUs the recipe expects (or pass --nproc-per-node / --expect-gpus)"

    def check_arch(self) -> dict[str, Any]:
        torch = self.torch
        count = self.api.device_count() if self.api is not None else 0
        if not count:
            return self.log.result("arch", "skip", reason="no GPU visible")
        arch_list = list(self.api.get_arch_list())
        if self.kind != "cuda":
            return self._other_arch(arch_list, count)
        fault = faults(self.rank.rank).get("arch", "")
        if fault.startswith("arch="):
            arch_list = fault[5:].split("+")
        caps = [tuple(torch.cuda.get_device_capability(i)) for i in range(count)]
        missing = arch_gaps(arch_list, caps)  # type: ignore[arg-type]
        if missing:
            return self._arch_missing(
                arch_list, missing, "a CUDA variant whose wheels still include this GPU's arch"
            )
        return self.log.result(
            "arch", "pass", arch_list=arch_list, capabilities=[f"sm_{a}{b}" for a, b in caps]
        )

    def _other_arch(self, arch_list: list[str], count: int) -> dict[str, Any]:
        """ROCm: each GPU's gfx target in the build's list. XPU: the device names, not yet compared."""
        names = [str(self.api.get_device_properties(i).name) for i in range(count)]
        if self.kind == "xpu":
            return self.log.result(
                "arch",
                "skip",
                reason="XPU device families are not compared with the build's list yet",
                arch_list=arch_list,
                devices=names,
            )
        gcn = [str(getattr(self.api.get_device_properties(i), "gcnArchName", "")) for i in range(count)]
        missing = gfx_gaps(arch_list, gcn)
        if missing:
            return self._arch_missing(
                arch_list, missing, "a ROCm variant whose wheels include this GPU's gfx target"
            )
        return self.log.result("arch", "pass", arch_list=arch_list, capabilities=gcn)

    def _arch_missing(self, arch_list: list[str], missing: list[str], pick: str) -> dict[str, Any]:
        """The arch check's failure: the GPUs' targets the build has no kernels for, and the variant to pick."""
        return self.log.result(
            "arch",
            "fail",
            arch_list=arch_list,
            missing=missing,
            cause=f"this torch build has no kernels for {', '.join(missing)} (built for {' '.join(arch_list)})",
            hint=f"pick {pick} (envbuilder plan shows why)",
        )

    def check_cuda(self) -> dict[str, Any]:
        torch = self.torch
        if self.device == "cpu":
            return self.log.result("cuda", "skip", reason="no GPU for this rank")
        dev = torch.device(self.device)
        n = self.args.matmul_n
        # Drawn on the GPU: two 4096x4096 float64 matrices drawn on the CPU and copied took 1.4 s of each rank's run
        # (an H200 node), the GPU draws them in milliseconds.
        gen = torch.Generator(device=dev).manual_seed(int.from_bytes(os.urandom(4), "little"))
        a64 = torch.randn(n, n, generator=gen, dtype=torch.float64, device=dev)
        b64 = torch.randn(n, n, generator=gen, dtype=torch.float64, device=dev)
        ref = a64 @ b64
        norm = torch.linalg.norm(ref).item()
        errors: dict[str, float] = {}
        bounds = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 2e-2}
        previous = torch.backends.cuda.matmul.allow_tf32
        try:
            for name, dtype, tf32 in (
                ("fp32", torch.float32, False),
                ("tf32", torch.float32, True),
                ("bf16", torch.bfloat16, False),
            ):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                out = (a64.to(dtype) @ b64.to(dtype)).to(torch.float64)
                errors[name] = torch.linalg.norm(out - ref).item() / norm
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
        # NaN compares false with everything, so it never passes a bound.
        bad = {k: v for k, v in errors.items() if not v <= bounds[k]}
        figures = {"bf16_tflops": {"value": round(self._tflops(torch.bfloat16), 1), "unit": "TFLOP/s"}}
        data = {"relative_error": errors, "bounds": bounds, "n": n, "device": self.device, "figures": figures}
        if bad:
            worst = ", ".join(f"{k} {v:.2e} > {bounds[k]:.0e}" for k, v in bad.items())
            return self.log.result(
                "cuda",
                "fail",
                cause=f"matmul differs from the float64 reference: {worst}",
                hint="a faulty GPU or a broken CUDA library: report the node to the site",
                **data,
            )
        return self.log.result("cuda", "pass", **data)

    def _tflops(self, dtype: Any) -> float:
        torch = self.torch
        n = 8192
        a = torch.randn(n, n, device=self.device, dtype=dtype)
        b = torch.randn(n, n, device=self.device, dtype=dtype)
        for _ in range(3):
            a @ b
        self.api.synchronize(self.device)
        iters = 20
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ b
        self.api.synchronize(self.device)
        return 2 * n**3 * iters / (time.perf_counter() - t0) / 1e12

    # libraries ----------------------------------------------------------------------------------------------

    def check_libraries(self) -> dict[str, Any]:
        torch = self.torch
        versions: dict[str, Any] = {"cudnn": None, "nccl": None}
        if self.kind == "xpu" and self.device != "cpu":  # opens the SYCL runtime and Level Zero
            a = torch.ones(8, 8, device=self.device)
            (a @ a).sum().item()
        elif self.device != "cpu":  # CUDA, or ROCm (cudnn = MIOpen's version, nccl = RCCL's)
            # CUDA libraries open lazily: use each once (cuBLAS, cuDNN, NCCL) before reading the process's maps.
            a = torch.ones(8, 8, device=self.device)
            (a @ a).sum().item()
            versions["cudnn"] = torch.backends.cudnn.version()
            versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        else:
            torch.ones(64).sum().item()
        loaded = loaded_libraries()
        copies = wheel_copies(loaded)
        bad = shadowed(loaded, copies)
        data = {
            "loaded": loaded,
            "versions": versions,
            "ld_library_path": os.environ.get("LD_LIBRARY_PATH", ""),
        }
        if bad:
            names = ", ".join(
                f"{k} from {v['loaded']} ({_how(v['loaded'])}{', beside the wheel copy' if v['both'] else ''})"
                for k, v in sorted(bad.items())
            )
            return self.log.result(
                "libraries",
                "fail",
                shadowed=bad,
                cause=f"another copy was loaded instead of the wheel's: {names}",
                hint="a module put another copy first (LD_LIBRARY_PATH or LD_PRELOAD): unload it, or drop it "
                "from the recipe's activate.modules",
                **data,
            )
        return self.log.result("libraries", "pass", **data)

    # affinity -----------------------------------------------------------------------------------------------

    # distributed --------------------------------------------------------------------------------------------

    def _dist(self) -> Any:
        """The process group (init once); None when it cannot work, with the reason in dist_broken."""
        import torch.distributed as dist

        if self.dist_ready:
            return dist
        if self.dist_broken:
            return None
        backend = dist_backend(self.kind) if self.device != "cpu" else "gloo"
        timeout = datetime.timedelta(seconds=self.args.timeout)
        if self.device != "cpu":
            self.api.set_device(self.torch.device(self.device))
        self.log.advance()  # the rendezvous waits for every rank
        if self.rank.torchrun:
            dist.init_process_group(backend, timeout=timeout)
        else:
            addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
            port = os.environ.get("MASTER_PORT", "29500")
            dist.init_process_group(
                backend,
                init_method=f"tcp://{addr}:{port}",
                rank=self.rank.rank,
                world_size=self.rank.world,
                timeout=timeout,
            )
        self.dist_ready = True
        return dist

    def check_nccl(self) -> dict[str, Any]:
        torch = self.torch
        dist = self._dist()
        backend = dist.get_backend()
        world = dist.get_world_size()
        dev = self.device
        ok = True
        for numel in (1, 1023, 1 << 20):
            t = torch.full((numel,), float(self.rank.rank + 1), device=dev)
            self.log.advance()
            dist.all_reduce(t)
            ok = ok and bool((t == world * (world + 1) / 2).all().item())
        flag = torch.tensor([1 if ok else 0], device=dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if not ok or flag.item() == 0:
            return self.log.result(
                "nccl",
                "fail",
                backend=backend,
                cause=f"all_reduce gave a wrong sum on {'this rank' if not ok else 'another rank'}",
                hint="a faulty link or a mismatched NCCL: check the libraries check",
            )
        sweep = self._sweep(dist, world)
        largest = sweep[-1]
        figures = {
            "busbw": {"value": round(largest["busbw"], 2), "unit": "GB/s", "bytes": largest["bytes"]},
            "busbw_peak": {"value": round(max(r["busbw"] for r in sweep), 2), "unit": "GB/s"},
            "latency_small_us": {"value": round(sweep[0]["us"], 1), "unit": "us", "bytes": sweep[0]["bytes"]},
        }
        return self.log.result("nccl", "pass", backend=backend, world=world, sweep=sweep, figures=figures)

    def _sweep(self, dist: Any, world: int) -> list[dict[str, Any]]:
        torch = self.torch
        sizes = []
        size = self.args.sweep_max
        while size >= 1024:
            sizes.append(size)
            size //= 4
        rows = []
        buf = torch.ones(sizes[0] // 4, dtype=torch.float32, device=self.device)
        for nbytes in reversed(sizes):
            t = buf[: nbytes // 4]
            iters = 20 if nbytes <= 64 << 20 else 10
            for _ in range(3):
                dist.all_reduce(t)
            self._sync()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                self.log.advance()
                dist.all_reduce(t)
            self._sync()
            elapsed = torch.tensor(
                [(time.perf_counter() - t0) / iters], dtype=torch.float64, device=self.device
            )
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the figure
            seconds = elapsed.item()
            algbw, busbw = bus_bandwidth(nbytes, seconds, world)
            rows.append({"bytes": nbytes, "us": seconds * 1e6, "algbw": algbw, "busbw": busbw})
        return rows

    def _sync(self) -> None:
        if self.device != "cpu":
            self.api.synchronize(self.device)

    def check_ddp(self) -> dict[str, Any]:
        torch = self.torch
        dist = self._dist()
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import DataLoader, TensorDataset
        from torch.utils.data.distributed import DistributedSampler

        gen = torch.Generator().manual_seed(1234)  # the same data everywhere; the sampler splits it
        x = torch.randn(1024, 32, generator=gen)
        y = x @ torch.randn(32, 1, generator=gen) + 0.01 * torch.randn(1024, 1, generator=gen)
        sampler = DistributedSampler(TensorDataset(x, y), shuffle=True, seed=7)
        loader = DataLoader(TensorDataset(x, y), batch_size=32, sampler=sampler)
        torch.manual_seed(self.rank.rank)  # different initial weights per rank: DDP must broadcast rank 0's
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(
            self.device
        )
        self.log.advance()  # the constructor broadcasts rank 0's parameters
        ddp = DistributedDataParallel(model, device_ids=[self.device] if self.device != "cpu" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.02)
        losses = []
        for epoch in range(self.args.epochs):
            sampler.set_epoch(epoch)
            total = torch.zeros(2, dtype=torch.float64, device=self.device)
            for xb, yb in loader:
                opt.zero_grad()
                self.log.advance()  # backward all-reduces the gradients
                loss = torch.nn.functional.mse_loss(ddp(xb.to(self.device)), yb.to(self.device))
                loss.backward()
                opt.step()
                total += torch.tensor(
                    [loss.item() * len(xb), len(xb)], dtype=torch.float64, device=self.device
                )
            dist.all_reduce(total)
            losses.append((total[0] / total[1]).item())
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, flat)
        spread = max((g - flat).abs().max().item() for g in gathered)
        data = {
            "losses": [round(v, 5) for v in losses],
            "param_spread": spread,
            "steps": len(loader) * len(losses),
        }
        if not losses[-1] < 0.9 * losses[0] or math.isnan(losses[-1]):
            return self.log.result("ddp", "fail", cause=f"the loss did not go down: {losses}", **data)
        if spread != 0.0:
            return self.log.result(
                "ddp",
                "fail",
                cause=f"parameters differ between ranks after training (max difference {spread:.3g})",
                hint="gradients are not being averaged: a broken collective or a mismatched model",
                **data,
            )
        return self.log.result("ddp", "pass", **data)

    # mpi ----------------------------------------------------------------------------------------------------

    def check_mpi(self) -> dict[str, Any]:
        if not self.rank.mpi:
            return self.log.result(
                "mpi", "skip", reason="not launched by an MPI launcher (torchrun starts ranks)"
            )
        try:
            from mpi4py import MPI
        except ImportError:
            return self.log.result("mpi", "skip", reason="mpi4py is not installed in this env")
        comm = MPI.COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()
        if (rank, size) != (self.rank.rank, self.rank.world):
            return self.log.result(
                "mpi",
                "fail",
                cause=f"MPI says rank {rank} of {size}, the launcher said {self.rank.rank} of {self.rank.world}",
                hint="mpi4py uses another MPI than the launcher (each rank is a singleton): load the MPI module "
                "mpi4py was built against",
            )
        # Point to point from rank 0 to every rank and back (what Vista's test.py meant to do).
        token = os.urandom(8).hex()
        t0 = time.perf_counter()
        replies_ok = True
        if rank == 0:
            for peer in range(1, size):
                comm.send({"token": token, "to": peer}, dest=peer, tag=11)
                reply = comm.recv(source=peer, tag=12)
                replies_ok = replies_ok and reply == {"token": token, "from": peer}
        else:
            msg = comm.recv(source=0, tag=11)
            comm.send({"token": msg["token"], "from": rank}, dest=0, tag=12)
        p2p_us = (time.perf_counter() - t0) * 1e6
        total = comm.allreduce(rank + 1)
        mapping = comm.gather(
            {
                "rank": rank,
                "host": socket.gethostname(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "device": self.device,
            },
            root=0,
        )
        replies_ok = comm.bcast(replies_ok, root=0)
        data: dict[str, Any] = {
            "size": size,
            "library": MPI.Get_library_version().splitlines()[0].strip(),
            "import_order": import_order(sys.modules),
        }
        if rank == 0:
            data["mapping"] = mapping
        if not replies_ok or total != size * (size + 1) // 2:
            return self.log.result("mpi", "fail", cause="point-to-point or allreduce gave wrong data", **data)
        if rank == 0 and self.args.device == "cuda":
            shared = shared_gpus(mapping or [])
            if shared:
                return self.log.result(
                    "mpi",
                    "fail",
                    cause=f"ranks share a GPU: {shared}",
                    hint="bind one GPU per rank before MPI starts (launcher.gpu_affinity)",
                    **data,
                )
        data["figures"] = {"p2p_roundtrip_us": {"value": round(p2p_us / max(size - 1, 1), 1), "unit": "us"}}
        return self.log.result("mpi", "pass", **data)

    # filesystem ---------------------------------------------------------------------------------------------

    def check_filesystem(self) -> dict[str, Any]:
        if not self.args.fs:
            return self.log.result("filesystem", "skip", reason="no directory to check ($SCRATCH unset)")
        results = []
        for root in self.args.fs:
            results.append(fs_roundtrip(root, self.rank.rank))
        bad = [r for r in results if r.get("error")]
        figures = {
            "write_mb_s": {"value": round(min(r.get("write_mb_s", 0) for r in results), 1), "unit": "MB/s"}
        }
        if bad:
            return self.log.result(
                "filesystem",
                "fail",
                dirs=results,
                cause="; ".join(f"{r['dir']}: {r['error']}" for r in bad),
                hint="is the file system mounted on this node, and within quota?",
            )
        return self.log.result("filesystem", "pass", dirs=results, figures=figures)

    # horovod ------------------------------------------------------------------------------------------------


def _how(path: str) -> str:
    """Which loader setting put ``path`` first."""
    where = os.path.dirname(os.path.realpath(path))
    for var in ("LD_PRELOAD", "LD_LIBRARY_PATH"):
        for entry in os.environ.get(var, "").replace(" ", ":").split(":"):
            if entry and (
                os.path.realpath(entry) == os.path.realpath(path) or os.path.realpath(entry) == where
            ):
                return f"through {var}"
    return "from outside the env"
