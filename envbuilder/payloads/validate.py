"""Validation payload, run by the env's own python (one process per rank). Prints one JSON record per rank.

This release implements the import, gpu and arch checks; the others are reported as "skipped" with the reason
until the validation issue lands them. The record format is the contract the CLI merges.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

IMPLEMENTED = ("import", "gpu", "arch")


def _rank() -> int:
    for var in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def _sm(arch: str) -> tuple[int, int]:
    digits = arch.split("_", 1)[1].rstrip("af")
    return int(digits[:-1]), int(digits[-1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checks", default="import,gpu,arch")
    parser.add_argument("--expect-gpus", type=int, default=None)
    args = parser.parse_args(argv)
    record: dict = {"rank": _rank(), "host": os.uname().nodename, "checks": {}}
    ok = True
    t0 = time.perf_counter()
    try:
        import torch
    except Exception as exc:  # the record must say why, whatever it was
        record["checks"]["import"] = {"status": "fail", "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(record), flush=True)
        return 1
    record["checks"]["import"] = {
        "status": "pass",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    for check in [c for c in args.checks.split(",") if c and c != "import"]:
        if check not in IMPLEMENTED:
            record["checks"][check] = {"status": "skipped", "reason": "not implemented in this release"}
            continue
        count = torch.cuda.device_count() if torch.version.cuda else 0
        if check == "gpu":
            expected = args.expect_gpus
            status = "pass" if expected is None or count == expected else "fail"
            record["checks"]["gpu"] = {
                "status": status,
                "count": count,
                "expected": expected,
                "devices": [torch.cuda.get_device_name(i) for i in range(count)],
            }
        elif check == "arch":
            arch_list = torch.cuda.get_arch_list() if count else []
            missing = []
            built = [_sm(a) for a in arch_list if a.startswith("sm_")]
            ptx = [_sm(a) for a in arch_list if a.startswith("compute_")]
            for i in range(count):
                major, minor = torch.cuda.get_device_capability(i)
                sass = any(b[0] == major and b[1] <= minor for b in built)
                jit = any(p <= (major, minor) for p in ptx)
                if not (sass or jit):
                    missing.append(f"sm_{major}{minor}")
            record["checks"]["arch"] = {
                "status": "fail" if missing else ("pass" if count else "skipped"),
                "arch_list": arch_list,
                "missing": missing,
            }
        ok = ok and record["checks"][check]["status"] != "fail"
    print(json.dumps(record), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(sys.argv[1:]))
