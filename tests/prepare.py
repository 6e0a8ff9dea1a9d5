"""What the tests need fetched before they run, made once per machine under /var/cache/envbuilder-tests: PyPI's
files the tests install (tests/testwheels.py), the aarch64 node (tests/armtwin.py), the bullseye compute nodes
(tests/computetwin.py), the container tests' OCI images (tests/containers.py, made from the PyPI files) and one
CPython download (tests/standinpython.py: python-build-standalone's where its host answers, else a stand-in made
here). Only this step uses the network (PyPI, Debian's mirror, that host); the tests reach loopback only. The
README's test command runs it first. A node that cannot be made here is named, and its tests skip saying why;
PyPI's files are needed by every torch test, so without them this exits 1."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import armtwin
import computetwin
import containers
import standinpython
import testwheels


def _try(name: str, make: Callable[[], object]) -> None:
    try:
        make()
    except (OSError, subprocess.SubprocessError, SystemExit, RuntimeError) as exc:
        print(f"prepare: {name} could not be made here ({exc}); its tests skip and say why", file=sys.stderr)


def main() -> int:
    if testwheels.main() != 0:
        return 1
    _try("the aarch64 node (tests/armtwin.py)", armtwin.prepare)
    _try("the bullseye compute nodes (tests/computetwin.py)", computetwin.prepare)
    _try("the container images (tests/containers.py)", containers.prepare)
    _try("the CPython download of the managed-python tests (tests/standinpython.py)", standinpython.prepare)
    return 0


if __name__ == "__main__":
    sys.exit(main())
