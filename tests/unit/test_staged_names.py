"""Which files in a node directory are an env's staged copies (what `stage --clean` and a new digest remove)."""

from __future__ import annotations

import pytest

from envbuilder.scale import image, staging

KEY = "vcpu-0123456789abcdef"


@pytest.mark.parametrize(
    "entry",
    [
        f"{KEY}.unpacked",
        f"{KEY}.unpacked.activate.sh",
        f"{KEY}.unpacked.activate.fish",
        f"{KEY}.unpacked.activate.csh",
        f"{KEY}.unpacked.deactivate.csh",
        f".{KEY}.unpacked.partial-123",
        f".{KEY}.unpacked.link-9",
        f"{KEY}{image.SUFFIX}",
        f".{KEY}{image.SUFFIX}.partial-77",
        f"{KEY}.image.sif",  # a container env's image file, staged as it is (each runtime's name)
        f"{KEY}.image.sqfs",
        f".{KEY}.image.tar.partial-5",
        f".{KEY}.image.sif.link-9",
    ],
)
def test_every_file_a_stage_or_an_activation_leaves_is_the_envs(entry):
    assert staging._keys_of("vcpu", entry)


@pytest.mark.parametrize(
    "entry",
    [
        "vcpu-extra-0123456789abcdef.unpacked",  # another env whose name starts alike
        f"{KEY}.unpacked.activate.ps1",
        f"{KEY}.unpacked.validation",  # validation runs beside a mount are not a staged copy
        "vcpu-0123.unpacked",
        "vcpu-extra-0123456789abcdef.image.sif",
        f"{KEY}.image.sif.validation",
        f"{KEY}.other.sif",  # not a file name a runtime's image has
    ],
)
def test_other_files_are_left_alone(entry):
    assert not staging._keys_of("vcpu", entry)
