"""Property-based: the shipped recipes, mutated (values of other types, out-of-range numbers, unknown keys, deleted
keys, truncation, random bytes, hostile strings in every string field), then planned. Whatever the mutation, plan
exits with a documented code other than 1 (an internal error), prints no traceback, creates nothing under
$SCRATCH, and runs no command a value smuggles in (the marker file an injected ``touch`` would create).

Hypothesis runs derandomized (a fixed seed: the same examples every run) with a bounded number of examples, so
CI stays fast. Most examples run the CLI in-process (``helpers.run_cli``: ``cli.main``, what ``python -m envbuilder``
runs, in the environment a child would have); a few run the real CLI in a child process."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import FACTS, PLAN_ENV, REPO, run_cli, run_cli_process
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuilder.core import errors
from envbuilder.core._toml import dumps, loads
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog, Layer

pytestmark = pytest.mark.integration

SHIPPED = REPO / "recipes"
#: Every exit code the README documents, except 1: an internal error is a bug whatever the input.
DOCUMENTED = {errors.EXIT_OK, errors.EXIT_USAGE} | {family.exit_code for family in errors.FAMILIES}
MARKER = "@MARKER@"

#: Strings that would do harm if a value reached a shell, a command line, a renderer or a path unquoted.
HOSTILE = [
    f"$(touch {MARKER})",
    f"`touch {MARKER}`",
    f"x'; touch {MARKER}; echo '",
    f'x"; touch {MARKER}; echo "',
    f"x\ntouch {MARKER}",
    f"x\r\ntouch {MARKER}\r\n",
    f"; touch {MARKER} #",
    f"--target={MARKER}",
    f"-e touch {MARKER}",
    f"--index-url=http://127.0.0.1:9/{MARKER}",
    f"numpy; touch {MARKER}",
    f"numpy @ file://{MARKER}",
    f"../../../../..{MARKER}",
    f"${{HOME}}/../..{MARKER}",
    "{name}/../../../x",
    "[bold red]x[/bold red]",
    "[x]",
    "[/]",
    "x\x00y",
    "\x1b[31mred\x1b[0m",
    "\u202eevil",
    "é ü 𝄞",
    "",
    " ",
    "-",
    "%s%n%x",
    "${",
    "}{",
    "\\",
    "'\"",
    "x" * 5000,
]


#: What makes a file the recipe (or parent) being planned.
IDENTITY = {("recipe", "name"), ("extends",), ("schema_version",)}


@dataclass(frozen=True)
class Target:
    """A shipped file, and a recipe whose extends chain reads it (the one to plan after mutating the file)."""

    rel: str
    recipe: str
    facts: str


def _targets() -> list[Target]:
    catalog = Catalog([Layer("builtin", SHIPPED)])
    out = set()
    for name in catalog.names():
        recipe = loader.load(name, catalog)
        facts = "gh200-aarch64" if recipe.get("compute.arch") == "aarch64" else "h100"
        for shown in recipe.chain:
            out.add(Target(shown.split(":", 1)[1], name, str(FACTS / f"{facts}.json")))
    return sorted(out, key=lambda t: (t.rel, t.recipe))


TARGETS = _targets()


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list) and node:
        for i, value in enumerate(node):
            yield from _leaves(value, (*path, i))
    else:
        yield path, node


def _tables(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(node, dict):
        yield path
        for key, value in node.items():
            yield from _tables(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _tables(value, (*path, i))


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    _at(doc, path[:-1])[path[-1]] = value


scalars = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, -5, 65536, 2**63 - 1, 2**63, 10**26]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(HOSTILE),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(min_size=1, max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def mutations(draw: st.DrawFn) -> tuple[Target, bytes]:
    """A shipped file, mutated: (which file, and which recipe to plan; the new bytes)."""
    target = draw(st.sampled_from(TARGETS))
    raw = (SHIPPED / target.rel).read_bytes()
    doc = loads(raw.decode())
    kind = draw(
        st.sampled_from(["value", "hostile-all", "hostile-one", "unknown-key", "delete", "truncate", "bytes"])
    )
    leaves = list(_leaves(doc))
    if kind == "value":
        path, _ = draw(st.sampled_from(leaves))
        _set(doc, path, draw(values))
    elif kind == "hostile-all":
        # Every string field at once, each with its own hostile string; the names that find the file and its
        # parent are kept, or the first check (recipe.name) would stop every example.
        for path, value in leaves:
            if isinstance(value, str) and path not in IDENTITY:
                _set(doc, path, draw(st.sampled_from(HOSTILE)))
    elif kind == "hostile-one":
        strings = [path for path, value in leaves if isinstance(value, str)] or [leaves[0][0]]
        _set(doc, draw(st.sampled_from(strings)), draw(st.sampled_from(HOSTILE)))
    elif kind == "unknown-key":
        table = _at(doc, draw(st.sampled_from(list(_tables(doc)))))
        table[draw(st.one_of(st.text(min_size=1, max_size=10), st.sampled_from(HOSTILE[:8])))] = draw(values)
    elif kind == "delete":
        path = draw(st.sampled_from([p for p, _ in leaves if p]))
        parent = _at(doc, path[:-1])
        del parent[path[-1]]
    if kind in ("truncate", "bytes"):
        cut = draw(st.integers(min_value=0, max_value=len(raw)))
        if kind == "truncate":
            return target, raw[:cut]
        junk = draw(st.binary(min_size=1, max_size=16))
        return target, raw[:cut] + junk + raw[cut + draw(st.integers(0, 4)) :]
    return target, dumps(doc).encode()


@contextlib.contextmanager
def _sandbox(target: Target, content: bytes) -> Iterator[tuple[Path, dict[str, str]]]:
    """A copy of the shipped recipes with the mutated file, and a user's environment that puts it on the path."""
    with tempfile.TemporaryDirectory(prefix="eb-fuzz-") as tmp:
        root = Path(tmp)
        # The file's top directory is enough: its extends chain stays inside it (tacc/center.toml), and the
        # copy, later on the path, shadows the built-in recipes of the same names.
        top = target.rel.split("/")[0]
        if (SHIPPED / top).is_dir():
            shutil.copytree(SHIPPED / top, root / "recipes" / top)
        (root / "recipes" / target.rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "recipes" / target.rel).write_bytes(content)
        env = {
            **PLAN_ENV,
            "HOME": str(root / "home"),
            "SCRATCH": str(root / "scratch"),
            "ENVBUILDER_HOME": str(root / "eb-home"),
            "ENVBUILDER_RECIPE_PATH": str(root / "recipes"),
        }
        yield root, env


def _hostile(content: bytes, marker: Path) -> bytes:
    return content.replace(MARKER.encode(), str(marker).encode())


def _check(code: int, output: str, root: Path, marker: Path) -> None:
    assert code in DOCUMENTED and code != errors.EXIT_INTERNAL, output
    assert "Traceback" not in output, output
    assert "internal error" not in output, output
    assert not (root / "scratch").exists(), "plan created something under $SCRATCH"
    assert not marker.exists(), "a recipe value ran a command"


@settings(
    derandomize=True,
    database=None,
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mutations())
def test_mutated_recipes_plan_or_fail_cleanly(mutation: tuple[Target, bytes]) -> None:
    target, content = mutation
    with tempfile.TemporaryDirectory(prefix="eb-marker-") as mark_dir:
        marker = Path(mark_dir) / "marker"
        with _sandbox(target, _hostile(content, marker)) as (root, env):
            res = run_cli("plan", target.recipe, "--facts", target.facts, "--json", env=env)
            _check(res.returncode, res.stdout + res.stderr, root, marker)
            if res.returncode == errors.EXIT_OK:
                assert '"status": "ok"' in res.stdout


@settings(
    derandomize=True,
    database=None,
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(mutations())
def test_mutated_recipes_through_the_real_cli(mutation: tuple[Target, bytes]) -> None:
    target, content = mutation
    with tempfile.TemporaryDirectory(prefix="eb-marker-") as mark_dir:
        marker = Path(mark_dir) / "marker"
        with _sandbox(target, _hostile(content, marker)) as (root, env):
            res = run_cli_process("plan", target.recipe, "--facts", target.facts, env=env, timeout=60)
            _check(res.returncode, res.stdout + res.stderr, root, marker)


def test_the_mutations_reach_the_checks() -> None:
    # A fuzz test whose mutations never got past the reader would prove little: the controls are an unmutated
    # copy that plans, and hostile values the schema refuses by file and key (exit 3).
    target = next(t for t in TARGETS if t.recipe == "local")
    with _sandbox(target, (SHIPPED / target.rel).read_bytes()) as (root, env):
        assert run_cli("plan", "local", "--facts", target.facts, env=env).returncode == 0
    doc = loads((SHIPPED / target.rel).read_text(encoding="utf-8"))
    doc["launcher"]["port"] = -1
    with _sandbox(target, dumps(doc).encode()) as (root, env):
        res = run_cli("plan", "local", "--facts", target.facts, env=env)
    assert res.returncode == 3
    assert f"{root}/recipes/local.toml: launcher.port: expected an integer from 1 to 65535" in res.stderr
