"""A compute node without a network, for tests: a command run in a network namespace of its own whose only
interface is loopback (``unshare -n``, then ``ip link set lo up``; root only). Nothing it sends leaves the
namespace, so an upstream URL (pypi.org, download.pytorch.org) fails there as it does on such a node, while a
mirror served inside the namespace on 127.0.0.1 works.

The node also has its own host name (a UTS namespace) and its own pids (a PID namespace with its own /proc): when
the command ends, or the test gives up on it, every process it started ends with it, however it hung.

Two kinds of node: by default a connection or a name lookup fails at once (no route); with ``dropped`` a route out
leads to a peer that drops every packet, as a firewall that drops rather than refuses does, so each lookup and
connection waits for its own timeout. With ``hostname`` the node's name is one that nothing there resolves (not in
/etc/hosts, no DNS reachable), as on a node whose name only the site's DNS knows.

Run as a script inside the namespace: ``python offline_node.py [--serve DIR] [--hostname NAME] [--dropped] --
ARGV...`` brings loopback up, serves DIR as a wheel index on 127.0.0.1 (ENVBUILDER_INDEX_MIRROR then points at it)
and runs ARGV."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
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
    res = subprocess.run([*UNSHARE, "ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    return None if res.returncode == 0 else f"{' '.join(UNSHARE)} failed here: {res.stderr.strip()}"


@cache
def why_not_dropped() -> Optional[str]:
    """Why no node with a dropping way out can be made here (None where one can)."""
    reason = why_not()
    if reason is not None:
        return reason
    res = subprocess.run(
        [*UNSHARE, sys.executable, str(Path(__file__).resolve()), "--dropped", "--", "true"],
        capture_output=True,
        text=True,
    )
    return None if res.returncode == 0 else f"no veth pair in a network namespace here: {res.stderr.strip()}"


#: A network, host name and pid space of the node's own; its first process's end (or its parent's: --kill-child)
#: ends every process in it.
UNSHARE = ("unshare", "--net", "--uts", "--pid", "--fork", "--mount-proc", "--kill-child")


def run_offline(
    argv: list[str],
    env: dict[str, str],
    *,
    serve: Optional[Path] = None,
    hostname: Optional[str] = None,
    dropped: bool = False,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``argv`` on a node without a network; with ``serve``, beside a wheel index of that directory on the
    namespace's own loopback; with ``hostname``, on a node of that name; with ``dropped``, where packets sent out
    are dropped (see the module's text)."""
    inner = [sys.executable, str(Path(__file__).resolve())]
    if serve is not None:
        inner += ["--serve", str(serve)]
    if hostname is not None:
        inner += ["--hostname", hostname]
    if dropped:
        inner.append("--dropped")
    return subprocess.run(
        [*UNSHARE, *inner, "--", *argv], env=env, capture_output=True, text=True, timeout=timeout
    )


#: The dropped node's way out: a veth pair whose far end has no address, reached through a gateway whose MAC no
#: interface has, so every packet routed out is sent and dropped there without an error.
DROPPED = (
    ("ip", "link", "add", "out0", "type", "veth", "peer", "name", "out1"),
    ("ip", "link", "set", "out0", "up"),
    ("ip", "link", "set", "out1", "up"),
    ("ip", "addr", "add", "10.99.0.2/24", "dev", "out0"),
    ("ip", "neigh", "add", "10.99.0.1", "lladdr", "02:00:00:00:99:01", "dev", "out0", "nud", "permanent"),
    ("ip", "route", "add", "default", "via", "10.99.0.1", "dev", "out0"),
)


def _main(args: list[str]) -> int:
    split = args.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", type=Path)
    parser.add_argument("--hostname")
    parser.add_argument("--dropped", action="store_true")
    own, argv = parser.parse_args(args[:split]), args[split + 1 :]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for step in DROPPED if own.dropped else ():
        subprocess.run(step, check=True)
    if own.hostname:
        socket.sethostname(own.hostname)
    if own.serve is None:
        return subprocess.run(argv).returncode
    sys.path.insert(0, str(HERE))
    from wheelindex import mirror_env, serve  # only the serving side needs it

    with serve(own.serve) as index:
        env = {**os.environ, "ENVBUILDER_INDEX_MIRROR": mirror_env(index)}
        return subprocess.run(argv, env=env).returncode


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
