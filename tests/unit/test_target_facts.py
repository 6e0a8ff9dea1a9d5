"""The compute nodes' OS, glibc and Python: every shipped site states them (or says it does not know, and why),
the plan says where each of the target's came from, and a gate decided on the planning host's fact says so."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from helpers import PLAN_ENV

from envbuilder import plan
from envbuilder.core.errors import ResolverErrors
from envbuilder.core.facts import HostFacts
from envbuilder.plan import target
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog

CATALOG = Catalog.from_env({})
SITE_RECIPES = sorted(n for n in CATALOG.names() if n != "local")
#: A login node as ``envbuilder probe`` sees it: no GPU, its own glibc and Python.
LOGIN = HostFacts(arch="x86_64", glibc="2.36", python="3.11.7", gpus=(), hostname="login1")


def make(name: str, host: HostFacts = LOGIN, **overrides: object) -> plan.Plan:
    recipe = loader.load(name, CATALOG, {k: (v, "test") for k, v in overrides.items()})
    return plan.build(recipe, host, PLAN_ENV)


def facts_of(p: plan.Plan) -> dict[str, target.TargetFact]:
    return {f.name: f for f in p.target_facts}


@pytest.mark.parametrize("name", SITE_RECIPES)
def test_every_shipped_site_states_its_compute_os_glibc_and_python_with_a_source(name):
    compute = loader.load(name, CATALOG).compute
    for fact in ("os", "glibc", "python"):
        value = getattr(compute, fact)
        assert value, f'{name}: compute.{fact} is not stated (a value, or "unknown" with a note)'
        src = compute.sources.get(fact)
        assert src is not None and src.source, f"{name}: compute.sources.{fact} names no source"
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", src.checked), f"{name}: compute.sources.{fact}.checked"
        if value == "unknown" or fact == "glibc":
            # A glibc is read on a node (ldd) or derived from the OS release: the note says which, and why.
            assert src.note, f"{name}: compute.{fact} = {value} and no note says why or how it was found"


#: A login node of an older image than the compute nodes (CentOS 7's glibc).
OLD_LOGIN = HostFacts(arch="x86_64", glibc="2.17", python="3.11.7", gpus=(), hostname="login1")


@pytest.mark.parametrize("name", ["frontera-venv-cu124", "stampede3-venv-cu126"])
def test_the_login_nodes_glibc_is_marked_and_the_glibc_gate_warns(name):
    p = make(name)
    glibc = facts_of(p)["glibc"]
    assert (glibc.value, glibc.origin) == ("2.36", "host"), glibc
    assert "from this host" in glibc.detail and "ldd --version" in glibc.detail
    assert any(
        w.startswith("the glibc gate (manylinux wheels) was decided on this host's glibc 2.36")
        for w in p.warnings
    ), p.warnings
    assert p.to_json()["target_facts"][1] == glibc.to_json()


def test_polaris_python_is_marked_as_this_hosts():
    p = make("polaris-overlay-conda")
    python = facts_of(p)["python"]
    assert (python.value, python.origin) == ("3.11.7", "host"), python
    assert "conda/2026-10-01" in python.detail
    # torch comes from the site's module there: no gate was decided, so no gate warns.
    assert not any("gate" in w for w in p.warnings), p.warnings


def test_the_sites_glibc_decides_the_manylinux_gate_whatever_the_login_node_runs():
    """Lonestar6 runs Rocky 8.4 (glibc 2.28): torch 2.8's manylinux_2_28 wheels are planned there even from a
    login node of glibc 2.17, and a site glibc below the wheels' floor refuses them from a login node above it."""
    p = make("lonestar6-venv-cu128", OLD_LOGIN)
    glibc = facts_of(p)["glibc"]
    assert (p.target.glibc, glibc.origin) == ("2.28", "site"), glibc
    assert "6lonestar/system.md" in glibc.detail and "checked 2026-11-28" in glibc.detail, glibc
    assert p.to_json()["torch"]["torch"] == "2.8.0"
    assert not any("glibc gate" in w for w in p.warnings), p.warnings
    with pytest.raises(ResolverErrors, match=r"need glibc ≥ 2\.28 \(manylinux\), the target has glibc 2\.17"):
        make("lonestar6-venv-cu128", **{"compute.glibc": "2.17"})


def test_a_python_the_site_states_is_planned_where_the_recipe_names_none():
    p = make("polaris-overlay-conda", **{"compute.python": "3.12.9"})
    assert p.target.python == "3.12.9" and facts_of(p)["python"].origin == "site"


def test_inside_a_job_this_nodes_facts_are_the_compute_nodes():
    node = HostFacts(arch="x86_64", glibc="2.34", python="3.11.7", gpus=(), allocation={"SLURM_JOB_ID": "7"})
    p = make("frontera-venv-cu124", node)
    assert facts_of(p)["glibc"].origin == "node"
    assert not any("gate" in w for w in p.warnings), p.warnings


def test_inside_a_job_this_nodes_glibc_wins_over_a_site_file_that_says_otherwise():
    node = HostFacts(arch="x86_64", glibc="2.34", python="3.11.7", gpus=(), hostname="c001",
                     allocation={"SLURM_JOB_ID": "7"})  # fmt: skip
    p = make("frontera-venv-cu124", node, **{"compute.glibc": "2.28"})
    glibc = facts_of(p)["glibc"]
    assert (p.target.glibc, glibc.origin) == ("2.34", "node"), glibc
    assert "the site states 2.28, which is not this node's" in glibc.detail
    assert any(
        "compute.glibc 2.28 is not this node's: this node (c001) has glibc 2.34" in w for w in p.warnings
    )
    # Where they agree, the site's word stands (with its source) and nothing warns.
    agree = make("frontera-venv-cu124", node, **{"compute.glibc": "2.34"})
    assert facts_of(agree)["glibc"].origin == "site" and not any("compute.glibc" in w for w in agree.warnings)
    # Facts from a file are another node's, not a measurement of this one: the site's word stands.
    filed = make("frontera-venv-cu124", replace(node, source="c001.json"), **{"compute.glibc": "2.28"})
    assert filed.target.glibc == "2.28"


def test_a_python_gate_decided_on_this_hosts_python_warns():
    origins = (target.TargetFact("python", "3.13.1", "host", "from this host"),)
    (warning,) = target.host_fact_warnings(origins, resolved=True)
    assert warning.startswith(
        "the Python gate (which torch releases have wheels for it) was decided on this host's"
    )
    assert "python.version" in warning
    assert target.host_fact_warnings(origins, resolved=False) == []
