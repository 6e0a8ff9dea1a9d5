"""Which envs the smoke check writes bytecode into: only those whose imported packages all lie inside the env."""

from __future__ import annotations

import pytest

from envbuilder.backends.smoke import writes_bytecode
from envbuilder.system import state


def _record(**plan: object) -> state.EnvRecord:
    return state.EnvRecord("e", "r", "d", "/scratch/e", "now", plan={"kind": "venv", **plan})


@pytest.mark.parametrize(
    ("plan", "site_python", "expected"),
    [
        ({}, None, True),  # a venv with its own torch
        ({"kind": "conda"}, None, True),
        ({"kind": "overlay", "system_site_packages": True}, None, False),  # torch may be the site's
        ({"kind": "user-prefix"}, "/opt/site/bin/python", False),  # the site python runs it
    ],
)
def test_bytecode_is_written_only_inside_the_env(plan, site_python, expected):
    assert writes_bytecode(_record(**plan), site_python) is expected
