"""The day the index moves, part two: yanked releases (PEP 592) and local labels with suffixes (PEP 440), each
in its own world served on 127.0.0.1 (tests/torchindex.py's download.pytorch.org and PyPI, with one thing
changed), planned through the real CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import ok, run_cli, user_env
from torchindex import (
    ARCH_FLAGS,
    CUDA,
    NEWEST,
    REQUIRES_PYTHON,
    Entry,
    TorchIndex,
    build_torch_wheel,
    pytorch_like,
    serve,
    torch_mirror,
)

pytestmark = pytest.mark.integration

PY_TAG = f"cp{sys.version_info[0]}{sys.version_info[1]}"
PY = f"{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}"
H100 = {
    "driver_version": "580.95.05",
    "gpus": [{"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}],
}


def facts(tmp_path: Path, name: str, **values: object) -> str:
    data = {"arch": "x86_64", "glibc": "2.36", "python": PY, "gpus": [], **values}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return str(path)


def recipe(
    root: Path, version: str, variant: str, allow: tuple[str, ...] = (), name: str = "idx"
) -> dict[str, str]:
    d = root / "recipes"
    d.mkdir(parents=True, exist_ok=True)
    allowed = ", ".join(f'"{a}"' for a in allow)
    (d / f"{name}.toml").write_text(
        f'schema_version = 1\n[recipe]\nname = "{name}"\ndescription = "index test"\n'
        '[env]\nkind = "venv"\ninstaller = "uv"\nprefix = "${SCRATCH}/envs/{name}"\n'
        '[python]\ncommand = "python3"\n'
        f'[torch]\nversion = "{version}"\nvariant = "{variant}"\npackages = ["torch"]\nallow = [{allowed}]\n'
    )
    return {"ENVBUILDER_RECIPE_PATH": str(d)}


def plan_json(env: dict[str, str], facts_file: str) -> tuple[int, dict]:
    res = run_cli("plan", "idx", "--facts", facts_file, "--json", env=env)
    assert "Traceback" not in res.stderr
    return res.returncode, json.loads(res.stdout)


def yank(index: TorchIndex, root: str, version: str, reason: str) -> None:
    """Every ``version`` file under ``root`` yanked with ``reason`` ("" for none)."""
    entries = index.roots[root]
    for name, entry in list(entries.items()):
        if name.startswith(f"torch-{version}-") or name.startswith(f"torch-{version}+"):
            entries[name] = Entry(entry.path, entry.requires_python, reason)


def relabel(index: TorchIndex, root: str, version: str, label: str, out: Path) -> None:
    """``root``'s ``version`` files replaced by builds of the same variant labelled ``+label``."""
    variant = root.rsplit("/", 1)[-1]
    for name in [n for n in index.roots[root] if n.startswith(f"torch-{version}+")]:
        index.remove(root, name)
        tag = name.split("-", 2)[2][: -len(".whl")]
        wheel = build_torch_wheel(out, version, label, CUDA[variant], ARCH_FLAGS[variant], tag=tag)
        index.add(root, wheel, requires_python=REQUIRES_PYTHON[version])


@pytest.fixture
def world(tmp_path):
    """Today's world (tests/torchindex.py); each test changes one thing in it before serving it."""
    return pytorch_like(tmp_path / "files", PY_TAG)


# ---------------------------------------------------------------------------------------------------------------
# PEP 592: yanked releases


def test_a_pin_to_a_release_yanked_everywhere_names_the_index_reason_pep691(world, tmp_path):
    """A release newer than the table, yanked on every index (PEP 691 JSON, ``"yanked": "<reason>"``)."""
    for root in ("whl/cpu", "whl/cu130", "whl/cu132", "simple"):
        yank(world, root, NEWEST, "miscompiled kernels, use the next release")
    with serve(world) as server:
        cpu = facts(tmp_path, "cpu")
        env = user_env(tmp_path, torch_mirror(server), **recipe(tmp_path, NEWEST, "cpu"))
        code, out = plan_json(env, cpu)
        assert code == 4, out
        [error] = out["errors"]
        assert error["gate"] == "yanked", error
        assert (
            f"torch {NEWEST} is yanked on the index: miscompiled kernels, use the next release"
            in error["message"]
        )
        assert "not a known" not in error["message"]
        assert 'torch.allow = ["yanked"]' in error["hint"] and "2.15.0" in error["hint"]

        # `latest` never chooses it.
        latest = user_env(tmp_path, torch_mirror(server), **recipe(tmp_path, "latest", "cpu"))
        code, out = plan_json(latest, cpu)
        assert code == 0 and out["data"]["torch"]["torch"] == "2.15.0", out

        # A recipe that allows the gate gets exactly that build, with a warning.
        allowed = user_env(
            tmp_path, torch_mirror(server), **recipe(tmp_path, NEWEST, "cpu", allow=("yanked",))
        )
        code, out = plan_json(allowed, cpu)
        assert code == 0, out
        assert out["data"]["torch"]["requirements"] == [f"torch=={NEWEST}+cpu"]
        assert any(
            "allowed by the recipe (yanked)" in w and "miscompiled" in w for w in out["data"]["warnings"]
        )


def test_a_pin_to_a_table_release_yanked_on_its_variant_page_pep503(world, tmp_path):
    """PEP 503 HTML pages (``data-yanked``): 2.15.0 yanked on cu130 without a reason, 2.16.0 with one."""
    world.html_only.update(world.roots)
    yank(world, "whl/cu130", "2.15.0", "")
    yank(world, "whl/cu130", NEWEST, "wrong cuDNN")
    with serve(world) as server:
        h100 = facts(tmp_path, "h100", **H100)
        env = user_env(tmp_path, torch_mirror(server), **recipe(tmp_path, "2.15.0", "cu130"))
        code, out = plan_json(env, h100)
        assert code == 4, out
        found = {e["gate"]: e["message"] for e in out["errors"]}
        assert "torch 2.15.0 is yanked on the index, which gives no reason" in found["yanked"], found
        assert "index" not in found, found
        assert all(r.endswith(" html") for r in server.pages()), server.pages()

        latest = user_env(tmp_path, torch_mirror(server), **recipe(tmp_path, "latest", "cu130"))
        code, out = plan_json(latest, h100)
        assert code == 0, out
        assert out["data"]["torch"]["torch"] == "2.14.1"
        skipped = next(n for n in out["data"]["notes"] if "newer releases do not fit" in n)
        # 2.15.0 is a table release, tried and skipped; 2.16.0, known only from the page, is not a candidate at all.
        assert skipped.endswith(": 2.15.0 (yanked)"), skipped


# ---------------------------------------------------------------------------------------------------------------
# PEP 440 local labels: the first segment names the variant, the rest is kept


def test_a_label_with_a_suffix_is_a_build_of_its_first_segment(world, tmp_path):
    relabel(world, "whl/cu130", NEWEST, "cu130.post1", tmp_path / "post1")
    with serve(world) as server:
        h100 = facts(tmp_path, "h100", **H100)
        env = user_env(tmp_path, torch_mirror(server), **recipe(tmp_path, NEWEST, "cu130"))
        code, out = plan_json(env, h100)
        assert code == 0, out
        torch = out["data"]["torch"]
        assert (torch["variant"], torch["local"]) == ("cu130", "cu130.post1")
        assert torch["requirements"] == [f"torch=={NEWEST}+cu130.post1"]
        shown = ok(run_cli("plan", "idx", "--facts", h100, env=env))
        assert "(+cu130.post1 builds only)" in shown.stdout


def test_create_installs_a_cpu_cxx11_abi_build_and_the_guard_takes_it(world, tmp_path):
    """PyTorch has shipped ``+cpu.cxx11.abi`` builds: `latest` plans one, the install brings it, and the build
    guard (which reads the installed torch) takes it for the CPU build it is."""
    relabel(world, "whl/cpu", NEWEST, "cpu.cxx11.abi", tmp_path / "abi")
    with serve(world) as server:
        env = user_env(tmp_path, torch_mirror(server), **recipe(tmp_path, "latest", "cpu"))
        res = ok(run_cli("create", "idx", "--no-validate", "--json", env=env, timeout=300))
        data = json.loads(res.stdout)["data"]
        versions = {p["name"]: p["version"] for p in data["env"]["packages"]}
        assert versions["torch"] == f"{NEWEST}+cpu.cxx11.abi"
