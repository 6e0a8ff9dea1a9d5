"""The doctor's one result type and its severities, kept apart so every check, the report and the command
share a single definition of what ``action`` (exit 14), ``warning`` and ``info`` mean.

A finding is ``action`` (the env is broken here or is about to be), ``warning`` (worth knowing, still works) or
``info`` (what was checked and found fine, or could not be checked).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from envbuilder.core.structs import dataclass

ACTION = "action"
WARNING = "warning"
INFO = "info"
SEVERITIES = (ACTION, WARNING, INFO)
NODE = "node"


@dataclass(frozen=True)
class Finding:
    severity: str
    subject: str  # an env's name, or "node"
    check: str  # replan, python, libraries, table, nightly, lock, health, purge, record, image
    message: str
    fix: str = ""
    gate: str = ""

    def to_json(self) -> dict[str, Any]:
        data = {
            "severity": self.severity,
            "subject": self.subject,
            "check": self.check,
            "message": self.message,
            "fix": self.fix,
        }
        if self.gate:
            data["gate"] = self.gate
        return data


def ordered(findings: Iterable[Finding]) -> list[Finding]:
    """Actions first, then warnings, then the rest; the node before envs; otherwise as found."""
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), f.subject != NODE))
