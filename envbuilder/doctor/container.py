"""A container env's own checks (pure): its image file is the one create recorded (its sha256), the runtime that
runs it is on the PATH its modules give, and the python its programs run (the overlay venv's where
container.packages made one, else the image's python3) starts inside the image through that runtime. It has no
python of its own on the host (``kinds.Kind.own_python``), so the host python checks of other kinds do not
apply."""

from __future__ import annotations

from typing import Optional

from envbuilder.core.structs import dataclass
from envbuilder.doctor.findings import ACTION, INFO, Finding


@dataclass(frozen=True)
class ImageState:
    """What ``collect.image_state`` read of a container env's image file and runtime."""

    path: str
    #: The sha256 the record holds (create's, or restore's).
    recorded: str
    #: The file's sha256 now; "" where it is missing or could not be read (``problem`` says why).
    sha256: str
    problem: str
    runtime: str
    #: Where the runtime's program was found; "" where it was not.
    runtime_path: str
    #: The PATH it was looked for on, for the message.
    searched: str = ""
    #: The python its programs run inside the image, and what starting it there through the runtime said: its
    #: version (``python_ok``), or why it did not start; ``python_ok`` None where it was not tried (the image
    #: changed or unreadable, or no runtime).
    python: str = ""
    python_ok: Optional[bool] = None
    python_said: str = ""


def container_findings(name: str, state: ImageState) -> list[Finding]:
    """The image changed or unreadable, the runtime missing (a missing image is the health check's)."""
    found = []
    rebuild = f"envbuilder restore {name} --force (from a backup) or envbuilder create {name} --force"
    if state.problem:
        found.append(
            Finding(ACTION, name, "image", f"its image {state.path} cannot be read: {state.problem}", rebuild)
        )
    elif state.sha256 and state.recorded and state.sha256 != state.recorded:
        found.append(
            Finding(
                ACTION,
                name,
                "image",
                f"its image {state.path} is not the one recorded: sha256 {state.sha256[:16]}…, recorded "
                f"{state.recorded[:16]}… (replaced or damaged since it was built)",
                rebuild,
            )
        )
    elif state.sha256:
        found.append(
            Finding(
                INFO,
                name,
                "image",
                f"its image {state.path} is the one recorded (sha256 {state.sha256[:16]}…)",
            )
        )
    if not state.runtime_path:
        found.append(
            Finding(
                ACTION,
                name,
                "runtime",
                f"{state.runtime}, the runtime that runs its image, is not on the PATH its modules give "
                f"({state.searched or 'empty'})",
                f"load the site's module for {state.runtime} (the recipe's modules.load), or install it",
            )
        )
    else:
        found.append(Finding(INFO, name, "runtime", f"{state.runtime} runs its image: {state.runtime_path}"))
    if state.python_ok:
        found.append(
            Finding(
                INFO, name, "python", f"{state.python} starts inside its image: Python {state.python_said}"
            )
        )
    elif state.python_ok is not None:
        found.append(
            Finding(
                ACTION,
                name,
                "python",
                f"{state.python} does not start inside its image through {state.runtime}: {state.python_said}",
                rebuild,
            )
        )
    return found
