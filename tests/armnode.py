"""The user of the aarch64 node of tests/armtwin.py, for the Vista tests (test_aarch64_node.py and
test_aarch64_mpi.py, two files so that their two long builds run on two workers): the world's directories, Vista's
fixture module tree, and the CLI run on the node by its arm64 python."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import armtwin
import pytest
from helpers import FACTS, UserWorld

#: The node's python for the python3/3.11.8 module: the root's arm64 CPython 3.11.
NODE_PYTHON = "/usr/bin/python3.11"
#: The GH200's facts, as the node sees the checkout.
GH200 = f"{armtwin.SRC}/tests/data/facts/{(FACTS / 'gh200-aarch64.json').name}"


def require_node() -> None:
    """Skip, saying what is missing, where the node's root file system or wheels are not made."""
    why = armtwin.missing()
    if why:
        pytest.skip(f"no aarch64 node: {why}")


class Node(UserWorld):
    """A user of the aarch64 node: the world's directories (under ``root``, bound in at their own paths), the
    fixture module tree from the checkout, and the CLI run there by the node's python."""

    def __init__(self, root: Path, mirror: str) -> None:
        soft = root / "soft" / "python-3.11.8" / "bin"
        soft.mkdir(parents=True)
        for name in ("python3", "python", "python3.11"):
            (soft / name).symlink_to(NODE_PYTHON)  # resolved inside the node
        super().__init__(
            root,
            mirror,
            PATH="/usr/local/bin:/usr/bin:/bin",
            MODULEPATH=f"{armtwin.SRC}/tests/data/modules/site",
            ENVBUILDER_TEST_SOFT=str(root / "soft"),
            PYTHONPATH=armtwin.SRC,
            USER="tester",
            WORK=str(root / "work"),
        )
        self.timings: dict[str, float] = {}
        #: What the node sees at its own path besides the world: the world's root, and what a test adds.
        self.binds = [root]
        #: The node's libraries a test hides from the linker's default path (armtwin.enter).
        self.hide: list[str] = []

    def on_node(self, *args: str, timeout: float = 1500) -> tuple[int, dict[str, Any]]:
        """``envbuilder ARGS --json`` on the node: its exit code and envelope (the time it took in ``timings``)."""
        started = time.monotonic()
        argv = [f"{armtwin.DEPS}/bin/python", "-m", "envbuilder", *args, "--json"]
        res = armtwin.enter(argv, self.env, self.binds, timeout=timeout, hide=self.hide)
        self.timings[args[0]] = round(time.monotonic() - started, 1)
        try:
            envelope: dict[str, Any] = json.loads(res.stdout)
        except ValueError:
            raise AssertionError(
                f"{args}: exit {res.returncode}, no JSON\n{res.stdout}\n{res.stderr}"
            ) from None
        return res.returncode, envelope

    def ok(self, *args: str) -> Any:
        """The ``data`` of a successful ``envbuilder ARGS --json`` on the node."""
        code, envelope = self.on_node(*args)
        assert code == 0, json.dumps(envelope, indent=1)[-6000:]
        return envelope["data"]
