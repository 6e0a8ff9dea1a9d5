"""History records written by hand, as ``validate`` writes them to the store (one JSON file per run under
``<home>/history/<env>/``), for the report's tests; and a plausible history of one env over two weeks with a
driver upgrade and a module that appears, its NCCL bandwidth dropping after it."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, Optional

START = datetime.datetime(2026, 11, 1, 8, 0, tzinfo=datetime.timezone.utc)

#: The NCCL sweep's message sizes: 1 KiB to 256 MiB, every 4x.
SIZES = [2**k for k in range(10, 29, 2)]


def write_run(
    home: Path,
    env: str,
    when: datetime.datetime,
    host: str = "gpu001",
    pid: int = 4242,
    *,
    directory: Optional[Path] = None,
    **fields: Any,
) -> Path:
    """One run's record in the store (``<home>/history/<env>/``, or ``directory``), with the store's fields
    (``fields`` override them)."""
    record: dict[str, Any] = {
        "version": 1,
        "env": env,
        "recipe": "site-torch",
        "recipe_version": "3",
        "time": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "partition": "gpu-a100",
        "nodes": [host],
        "launcher": "srun",
        "ranks": 4,
        "facts": {
            "driver": "550.54",
            "cuda": "12.4",
            "torch": "2.5.1+cu124",
            "glibc": "2.34",
            "modules": {},
            "gpus": ["A100"] * 4,
        },
        "checks": [],
        "status": "pass",
        **fields,
    }
    directory = directory or home / "history" / env
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{when.strftime('%Y%m%dT%H%M%S.%fZ')}-{host}-{pid}.json"
    path.write_text(json.dumps(record))
    return path


def sweep(peak: float) -> list[dict[str, float]]:
    """Bus bandwidth rising with message size to ``peak`` GB/s."""
    return [{"bytes": b, "busbw": round(peak * b / (b + 2**22), 2)} for b in SIZES]


def two_weeks(home: Path, env: str = "site-torch", partitions: Optional[list[str]] = None) -> list[Path]:
    """Fourteen daily runs per partition: driver 550 -> 570 and module cuda/12.8 from day 8, the bus bandwidth
    falling from about 330 to 211 GB/s after it, the import check failing once."""
    paths = []
    for day in range(14):
        for index, part in enumerate(partitions or ["gpu-a100", "gpu-h100"]):
            upgraded = day >= 7
            busbw = (211.0 if upgraded else 330.0) + day % 3 + 40 * index
            imports = [1.1 + 0.05 * r + 0.01 * day + 0.2 * index for r in range(4)]
            status = "fail" if day == 4 and index == 0 else "pass"
            checks = [
                {
                    "name": "import",
                    "status": status,
                    "seconds": 3.0,
                    "figures": {"import_s": max(imports)},
                    "units": {"import_s": "s"},
                    "per_rank": {str(r): {"import_s": round(t, 3)} for r, t in enumerate(imports)},
                },
                {
                    "name": "nccl",
                    "status": "pass",
                    "seconds": 9.0,
                    "figures": {"busbw": round(busbw, 1), "busbw_peak": round(busbw + 5, 1)},
                    "units": {"busbw": "GB/s", "busbw_peak": "GB/s"},
                    "sweep": sweep(busbw),
                },
                {"name": "matmul", "status": "pass", "seconds": 4.0, "figures": {"bf16_tflops": 250.0 + day}},
            ]
            facts = {
                "driver": "570.86" if upgraded else "550.54",
                "cuda": "12.8" if upgraded else "12.4",
                "torch": "2.5.1+cu124",
                "glibc": "2.34",
                "modules": {"gcc": "12.2", **({"cuda": "12.8"} if upgraded else {})},
                "gpus": ["A100"] * 4,
            }
            when = START + datetime.timedelta(days=day, minutes=5 * index)
            paths.append(
                write_run(
                    home,
                    env,
                    when,
                    host=f"gpu00{index + 1}",
                    partition=part,
                    facts=facts,
                    checks=checks,
                    status="fail" if status == "fail" else "pass",
                )
            )
    return paths
