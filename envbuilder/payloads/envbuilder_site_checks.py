"""The checks of how a site places and builds things, beside the core suite: ``affinity`` (where each rank runs:
CPUs, cores, NUMA nodes, its GPU's, the host's network devices) and ``horovod`` (what the site's Horovod build has). Mixed into
``envbuilder_checks.Suite``; runs inside the env, standard library only at import."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any, Optional

from envbuilder_facts import (
    check_build,
    cpu_placement,
    gpu_placement,
    horovodrun,
    omp_threads,
    smi_bus_id,
    torch_bus_id,
)
from envbuilder_nics import network, pci_path, visible_gpu

#: Where the kernel tells the CPU and PCI topology (the affinity check).
SYSFS = "/sys"
#: A sysfs tree to read instead (a captured one, for tests); read by the affinity check only.
SYSFS_ROOT = "ENVBUILDER_SYSFS_ROOT"


def sysfs() -> str:
    return os.environ.get(SYSFS_ROOT) or SYSFS


class SiteChecks:
    """``check_affinity`` and ``check_horovod``; the Suite provides ``args``, ``log``, ``torch`` and ``device``."""

    args: Any
    log: Any
    rank: Any
    torch: Any
    device: str

    def check_affinity(self) -> dict[str, Any]:
        """Where this rank runs: its CPUs, their cores and NUMA nodes, its GPU's, and the host's network devices
        with the NCCL variables the rank was given. Only the ranks' records together show a binding error (two
        ranks on one core), so envbuilder's report judges them, and picks the NIC NCCL would likely use."""
        root = sysfs()
        data = cpu_placement(root)
        data["host"] = socket.gethostname()
        data["omp_num_threads"] = omp_threads(os.environ.get("OMP_NUM_THREADS"))
        data["network"] = network(root, os.environ)
        gpu = self._gpu_placement(root)
        if gpu is not None:
            data["gpu"] = gpu
        return self.log.result("affinity", "pass", **data)

    def _gpu_placement(self, root: str) -> Optional[dict[str, Any]]:
        """The rank's GPU: torch's device, found in /sys by torch's PCI bus id, else nvidia-smi's, else by its
        place in CUDA_VISIBLE_DEVICES. A CPU run on a GPU node whose launch gives each rank GPUs (a
        CUDA_VISIBLE_DEVICES the launcher sets) reports the GPU the rank was given, so its placement is judged
        all the same; None where it has none."""
        on_gpu = self.device.startswith("cuda")
        index = self.torch.device(self.device).index if on_gpu else self.rank.local
        bus_id, source = None, "torch"
        if on_gpu:
            props = self.torch.cuda.get_device_properties(index)
            bus_id = torch_bus_id(props) or smi_bus_id(str(getattr(props, "uuid", "")))
        if bus_id is None:
            bus_id = visible_gpu(root, os.environ.get("CUDA_VISIBLE_DEVICES"), index)
            source = "CUDA_VISIBLE_DEVICES"
        if bus_id is None:
            return {"index": index, "bus_id": None, "numa": None, "cpus": None} if on_gpu else None
        placed = gpu_placement(bus_id, root)
        return {"index": index, "source": source, **placed, "path": pci_path(root, placed["bus_id"])}

    def check_horovod(self) -> dict[str, Any]:
        runner = horovodrun(sys.executable)
        if runner is None:
            built = self._horovod_in_process()
            if built is None:
                return self.log.result("horovod", "skip", reason="horovod is not installed in this env")
        else:
            # The seed's own check; it also imports horovod's torch extension (in a process of its own).
            try:
                res = subprocess.run(
                    [runner, "--check-build"],
                    capture_output=True,
                    text=True,
                    timeout=self.args.timeout,
                    check=False,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                return self.log.result("horovod", "fail", cause=f"{runner} --check-build: {exc}")
            built = check_build(res.stdout)
            if res.returncode != 0 or not built:
                tail = (res.stderr or res.stdout).strip()[-400:]
                return self.log.result(
                    "horovod",
                    "fail",
                    cause=f"{runner} --check-build failed (exit status {res.returncode}): {tail}",
                )
        return self._horovod_verdict(built, runner)

    def _horovod_in_process(self) -> Optional[dict[str, dict[str, bool]]]:
        """What the importable horovod.torch says was built, in check-build's shape; None where it is not."""
        try:
            import horovod.torch as hvd
        except ImportError:
            return None

        def built(name: str) -> bool:
            return bool(getattr(hvd, f"{name}_built", lambda: False)())

        return {
            "frameworks": {"PyTorch": True},
            "controllers": {"MPI": built("mpi"), "Gloo": built("gloo")},
            "tensor operations": {
                "NCCL": built("nccl"),
                "DDL": built("ddl"),
                "CCL": built("ccl"),
                "MPI": built("mpi"),
                "Gloo": built("gloo"),
            },
        }

    def _horovod_verdict(self, built: dict[str, dict[str, bool]], runner: Optional[str]) -> dict[str, Any]:
        def names(section: str) -> list[str]:
            return [n for n, ok in built.get(section, {}).items() if ok]

        data = {
            "horovodrun": runner,
            "frameworks": names("frameworks"),
            "controllers": names("controllers"),
            "tensor_ops": names("tensor operations"),
        }
        wanted = self.args.horovod_gpu_ops or ("NCCL" if self.args.device == "cuda" else None)
        if "PyTorch" not in data["frameworks"]:
            cause = "horovod was built without PyTorch"
        elif not data["controllers"] or not data["tensor_ops"]:
            cause = "horovod was built without a controller or tensor operations"
        elif wanted and wanted.upper() not in (n.upper() for n in data["tensor_ops"]):
            why = "the recipe builds it with" if self.args.horovod_gpu_ops else "a GPU run needs"
            cause = f"horovod has no {wanted} tensor operations, which {why} HOROVOD_GPU_OPERATIONS={wanted}"
        else:
            return self.log.result("horovod", "pass", **data)
        return self.log.result(
            "horovod",
            "fail",
            cause=cause,
            hint="rebuild it (no build isolation, torch installed first) with HOROVOD_WITH_PYTORCH=1 and "
            "HOROVOD_GPU_OPERATIONS=NCCL",
            **data,
        )
