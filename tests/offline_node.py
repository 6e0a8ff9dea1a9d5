"""A compute node without a network, for tests: a command run in a network namespace of its own whose only
interface is loopback (``unshare -n``, then ``ip link set lo up``; root only). Nothing it sends leaves the
namespace, so an upstream URL (pypi.org, download.pytorch.org) fails there as it does on such a node, while a
mirror served inside the namespace on 127.0.0.1 works.

Run as a script inside the namespace: ``python offline_node.py [--serve DIR] -- ARGV...`` brings loopback up,
serves DIR as a wheel index on 127.0.0.1 (ENVBUILDER_INDEX_MIRROR then points at it) and runs ARGV."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent


@cache
def why_not() -> Optional[str]:
    """Why no namespace can be made here (None where one can)."""
    if os.geteuid() != 0:
        return "a network namespace needs root (unshare -n)"
    if not (shutil.which("unshare") and shutil.which("ip")):
        return "unshare (util-linux) or ip (iproute2) is not installed"
    res = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    return None if res.returncode == 0 else f"unshare -n failed here: {res.stderr.strip()}"


def run_offline(
    argv: list[str], env: dict[str, str], *, serve: Optional[Path] = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``argv`` on a node without a network; with ``serve``, beside a wheel index of that directory on the
    namespace's own loopback."""
    inner = [sys.executable, str(Path(__file__).resolve())]
    if serve is not None:
        inner += ["--serve", str(serve)]
    return subprocess.run(
        ["unshare", "-n", *inner, "--", *argv], env=env, capture_output=True, text=True, timeout=timeout
    )


def _main(args: list[str]) -> int:
    split = args.index("--")
    own, argv = args[:split], args[split + 1 :]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    if not own:
        return subprocess.run(argv).returncode
    sys.path.insert(0, str(HERE))
    from wheelindex import mirror_env, serve  # only the serving side needs it

    with serve(Path(own[1])) as index:
        env = {**os.environ, "ENVBUILDER_INDEX_MIRROR": mirror_env(index)}
        return subprocess.run(argv, env=env).returncode


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
