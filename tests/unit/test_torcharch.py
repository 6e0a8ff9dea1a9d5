"""The key of the torch arch cache (backends/torcharch.py) on dist-info directories laid out by hand: what of an
installed RECORD counts (the wheel's own files) and what does not (what the installer wrote for this env), and
the RECORDs it will not trust."""

from __future__ import annotations

import hashlib
import random
import re
from base64 import urlsafe_b64encode
from pathlib import Path

import pytest

from envbuilder.backends import torcharch
from envbuilder.backends.torcharch import library_flags, wheel_digest

DIST = "torch-2.13.0+cu126.dist-info"


def row(site: Path, path: str, content: bytes) -> str:
    """Write ``content`` at ``path`` under ``site``; its RECORD row."""
    (site / path).parent.mkdir(parents=True, exist_ok=True)
    (site / path).write_bytes(content)
    digest = urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(content)}"


def install(
    site: Path, *, python: str = "/envs/a/bin/python", installer: str = "uv", arch: str = "sm_90"
) -> Path:
    """A torch install as an installer leaves it: the wheel's files and rows, then its own."""
    rows = [
        row(site, "torch/__init__.py", b"from torch import _C\n"),
        row(site, "torch/_C.py", f"def _cuda_getArchFlags():\n    return {arch!r}\n".encode()),
        row(site, "torch/lib/libtorch_cuda.so", b"\x7fELF" + arch.encode()),
        row(site, f"{DIST}/METADATA", b"Name: torch\nVersion: 2.13.0+cu126\n"),
        row(site, f"{DIST}/WHEEL", b"Wheel-Version: 1.0\nTag: cp311-cp311-manylinux_2_28_x86_64\n"),
        # The installer's: differ between two envs of one wheel.
        row(site, "../../../bin/torchrun", f"#!{python}\nimport torch\n".encode()),
        row(site, f"{DIST}/INSTALLER", f"{installer}\n".encode()),
        row(site, f"{DIST}/REQUESTED", b""),
        "torch/__pycache__/__init__.cpython-311.pyc,,",
        f"{DIST}/RECORD,,",
    ]
    (site / DIST).mkdir(parents=True, exist_ok=True)
    (site / DIST / "RECORD").write_text("\n".join(rows) + "\n")
    return site / DIST


def site(root: Path, name: str) -> Path:
    path = root / name / "lib/python3.11/site-packages"
    path.mkdir(parents=True)
    return path


def test_two_envs_of_one_wheel_share_a_digest(tmp_path):
    a = wheel_digest(install(site(tmp_path, "a")))
    b = wheel_digest(install(site(tmp_path, "b"), python="/envs/b/bin/python", installer="pip"))
    assert a is not None and a == b


def test_another_wheel_of_the_same_name_has_another_digest(tmp_path):
    a = wheel_digest(install(site(tmp_path, "a")))
    b = wheel_digest(install(site(tmp_path, "b"), arch="sm_80"))
    assert a is not None and b is not None and a != b


def test_records_it_does_not_trust_give_no_digest(tmp_path):
    dist = install(site(tmp_path, "a"))
    record = (dist / "RECORD").read_text()
    # A native library whose size on disk is not the size its RECORD row gives (a file swapped under its row).
    (dist.parent / "torch/lib/libtorch_cuda.so").write_bytes(b"\x7fELF something else")
    assert wheel_digest(dist) is None
    dist = install(site(tmp_path, "b"))
    (dist / "RECORD").write_text(record.replace("torch/_C.py,sha256=", "torch/_C.py,md5="))
    assert wheel_digest(dist) is None
    (dist / "RECORD").write_text(record.replace("torch/__init__.py,sha256=", "torch/__init__.py,,#"))
    assert wheel_digest(dist) is None
    (dist / "RECORD").unlink()
    assert wheel_digest(dist) is None


def test_a_record_with_quoted_rows_is_read_by_the_csv_module_to_the_same_digest(tmp_path):
    plain = install(site(tmp_path, "a"))
    quoted = install(site(tmp_path, "b"))
    text = (quoted / "RECORD").read_text()
    (quoted / "RECORD").write_text(text.replace("torch/__init__.py,", '"torch/__init__.py",'))
    assert wheel_digest(plain) == wheel_digest(quoted) is not None


#: Fields a RECORD row may be made of, plain (no quote, carriage return or NUL: those go to the csv module).
_PATHS = [
    "torch/a.py",
    "torch/lib/libx.so",
    "torch/lib/liby.so.1.2",
    "torch/lib/libz.so",
    f"{DIST}/METADATA",
    f"{DIST}/INSTALLER",
    f"{DIST}/RECORD",
    f"{DIST}/sub/RECORD",
    "../../../bin/torchrun",
    "/abs/file",
    "torch/__pycache__/a.cpython-311.pyc",
    "torch/b.pyc",
    "",
    " ",
    "torch/with space.py",
    "torch/so.pyx",
]
_STRONG = ["sha256=abc", "sha512=def", "sha384=x"]
_WEAK = ["md5=abc", "", "SHA256=abc", "sha256"]
_SIZES = ["3", "", "12", "x", "3,extra"]


@pytest.mark.parametrize("seed", range(100))
def test_the_plain_reading_of_a_record_is_the_csv_modules_row_for_row(tmp_path, seed):
    """wheel_digest splits a plain RECORD at its commas (a fifth of the csv module's time): on every mix of rows,
    kept and skipped, strong and weak, native libraries of the right and the wrong size, short and long rows, it
    answers as the csv module's reading does."""
    rng = random.Random(seed)  # noqa: S311 - test data, not a secret
    site_dir = tmp_path / "site"
    for name in ("torch/lib/libx.so", "torch/lib/liby.so.1.2"):
        (site_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (site_dir / name).write_bytes(b"abc")  # 3 bytes: the size "3" matches, "12" does not
    lines = []
    for _ in range(rng.randrange(1, 12)):
        digest = rng.choice(_WEAK if rng.random() < 0.05 else _STRONG)  # one weak row ends the reading
        fields = [rng.choice(_PATHS), digest, rng.choice(_SIZES)][: rng.choice((1, 2, 3, 3, 3, 3, 3))]
        lines.append(",".join(fields))
    if rng.random() < 0.3:
        lines.insert(rng.randrange(len(lines) + 1), "")
    text = "\n".join(lines) + rng.choice(("\n", ""))
    ours = f"{DIST}/"
    assert torcharch._read_plain(text, ours, site_dir) == torcharch._read_csv(text, ours, site_dir), text


# ---------------------------------------------------------------------------------------------------------------
# The arch list as its library's bytes hold it (library_flags)


def bindings(root: Path, *strings: bytes) -> Path:
    """A torch package whose lib/libtorch_python.so holds ``strings`` as C strings between other bytes."""
    lib = root / "torch" / "lib" / "libtorch_python.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF\x02\x01\x01\x00" + b"\x00".join(strings) + b"\x00\xff\xfe")
    return root / "torch"


def test_the_one_arch_list_string_of_the_library_is_the_list(tmp_path):
    package = bindings(tmp_path, b"sm_ is a prefix", b"sm_75 sm_80 sm_86 sm_90 sm_100 sm_120", b"CUDA")
    assert library_flags(package) == ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")


def test_a_list_inside_a_longer_string_is_not_taken(tmp_path):
    # The bytes around a run must end the C string on both sides: "-arch sm_90" is not a list of archs.
    assert library_flags(bindings(tmp_path, b"-arch sm_80 sm_90", b"sm_90 sm_100a")) == ("sm_90", "sm_100a")


@pytest.mark.parametrize(
    "strings",
    [
        pytest.param([b"sm_80 sm_90", b"sm_70"], id="two-different"),
        pytest.param([b"no arch here"], id="none"),
        pytest.param([b"-arch sm_80 sm_90"], id="inside-another"),
    ],
)
def test_a_library_that_cannot_tell_gives_nothing(tmp_path, strings):
    assert library_flags(bindings(tmp_path, *strings)) is None


def test_a_list_of_compute_names_and_one_at_the_start_of_the_file(tmp_path):
    assert library_flags(bindings(tmp_path, b"compute_90 sm_90a")) == ("compute_90", "sm_90a")
    lib = tmp_path / "torch" / "lib" / "libtorch_python.so"
    lib.write_bytes(b"sm_80 sm_90\x00rest")  # no NUL before it: not a C string the library holds
    assert library_flags(tmp_path / "torch") is None


def test_the_search_finds_what_a_whole_file_regular_expression_finds():
    """The anchored search against the plain definition (a regular expression tried at every byte), on random
    bytes made of the few that arch lists, their neighbours and NULs are made of."""
    whole = re.compile(rb"(?<=\x00)(?:sm|compute)_\d+[af]?(?: (?:sm|compute)_\d+[af]?)*(?=\x00)")
    pieces = [b"\x00", b" ", b"sm_", b"compute_", b"8", b"90", b"a", b"f", b"x", b"-arch ", b"sm", b"_"]
    rand = random.Random(36)  # noqa: S311 - test data, not a secret
    for _ in range(3000):
        data = b"".join(rand.choice(pieces) for _ in range(rand.randint(0, 40)))
        assert torcharch._literals(data) == {m.group(0) for m in whole.finditer(data)}, data


def test_no_library_or_an_empty_one_gives_nothing(tmp_path):
    assert library_flags(tmp_path / "torch") is None
    package = bindings(tmp_path, b"sm_90")
    (package / "lib" / "libtorch_python.so").write_bytes(b"")
    assert library_flags(package) is None
