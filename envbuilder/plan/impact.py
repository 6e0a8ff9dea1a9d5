"""What a planned change of a node (a new driver, an OS image, modules) does to a site's recipes and to the envs
users shared: each planned (a recipe) or judged (an env's record) against the node's facts before and after.

Pure: ``commands.impact`` reads the facts files, the registry, the records and the wheel indexes and hands them
over. A recipe BREAKS when it plans before the change and not after; CHANGES when another torch build would be
chosen; is UNAFFECTED otherwise; is BROKEN when it does not plan before the change nor after (the change is not
to blame), and FIXED when it plans only after. An env BREAKS when the torch build it has (or a module it loads) does not run on the node after the
change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Optional

from envbuilder.core.errors import EnvbuilderError, ResolverError, ResolverErrors
from envbuilder.core.facts import HostFacts
from envbuilder.core.structs import dataclass
from envbuilder.plan.planning import Options, build
from envbuilder.resolver.wheels import Matrix, TorchRequest, resolve

if TYPE_CHECKING:
    # only named: the loader reaches the registry (ssh-keygen), which a pure module must not import
    from envbuilder.recipe.loader import Recipe
    from envbuilder.resolver.indexfacts import IndexFacts

BREAKS = "BREAKS"
CHANGES = "CHANGES"
UNAFFECTED = "UNAFFECTED"
BROKEN = "BROKEN"
FIXED = "FIXED"
#: Worst first: the order the report lists its rows in.
STATUSES = (BREAKS, BROKEN, CHANGES, FIXED, UNAFFECTED)

#: What each resolver gate means to an admin: the reason's short name.
_CAUSES = {
    "driver": "driver floor",
    "gpu-arch": "GPU arch",
    "glibc": "glibc",
    "python": "python",
    "platform": "platform",
    "index": "not on the index",
    "aarch64-no-cuda-wheel": "not on the index",
    "variant-not-built": "not on the index",
    "package-missing": "not on the index",
    "unknown-release": "not on the index",
    "yanked": "not on the index",
}
#: The gates that say an installed build cannot run on a node (the others concern what an index offers).
RUNTIME_GATES = ("driver", "gpu-arch", "glibc", "python", "platform")


@dataclass(frozen=True)
class Reason:
    #: The short name (driver floor, glibc, module, not on the index, GPU arch, ...).
    cause: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"cause": self.cause, "message": self.message}


@dataclass(frozen=True)
class Outcome:
    """One side of the comparison: the torch build planned (or held), or why nothing plans (runs)."""

    build: Optional[str]
    reasons: tuple[Reason, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.reasons


@dataclass(frozen=True)
class Verdict:
    #: "recipe" or "env".
    kind: str
    #: The recipe's NAME@VERSION, or the env's name and whose it is.
    subject: str
    status: str
    before: Outcome
    after: Outcome
    #: Where the subject came from (the registry, the shipped recipes, a record's file).
    source: str = ""

    @property
    def why(self) -> str:
        """The verdict in words: the reasons, or the builds old -> new."""
        if self.status in (BREAKS, BROKEN):
            side = self.after if self.status == BREAKS else self.before
            return "; ".join(f"{r.cause}: {r.message}" for r in side.reasons)
        if self.status == CHANGES:
            return f"{self.before.build} -> {self.after.build}"
        if self.status == FIXED:
            fixed = "; ".join(r.cause for r in self.before.reasons)
            return f"{self.after.build or 'plans'} (before: {fixed})"
        return self.after.build or "no torch planned"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "subject": self.subject,
            "status": self.status,
            "source": self.source,
            "why": self.why,
            "before": {"build": self.before.build, "reasons": [r.to_json() for r in self.before.reasons]},
            "after": {"build": self.after.build, "reasons": [r.to_json() for r in self.after.reasons]},
        }


def verdict(kind: str, subject: str, before: Outcome, after: Outcome, source: str = "") -> Verdict:
    if not before.ok:
        status = BROKEN if not after.ok else FIXED
    elif not after.ok:
        status = BREAKS
    elif before.build != after.build:
        status = CHANGES
    else:
        status = UNAFFECTED
    return Verdict(kind, subject, status, before, after, source)


def sorted_verdicts(verdicts: Sequence[Verdict]) -> list[Verdict]:
    return sorted(verdicts, key=lambda v: (STATUSES.index(v.status), v.kind != "recipe", v.subject))


# ---------------------------------------------------------------------------------------------------------------
# A recipe, planned for the node before and after


def plan_outcome(
    recipe: Recipe,
    facts: HostFacts,
    env: Mapping[str, str],
    *,
    index: Optional[IndexFacts] = None,
    matrix: Optional[Matrix] = None,
) -> Outcome:
    """The torch build ``recipe`` plans on the node ``facts`` describes, or every reason it does not plan there
    (a failed gate, a module the node does not offer)."""
    reasons = list(missing_modules(recipe.modules.load, facts))
    try:
        plan = build(recipe, facts, env, Options(node_facts=True), matrix=matrix, index=index)
    except ResolverErrors as exc:
        return Outcome(None, (*reasons, *(_reason(e) for e in exc.errors)))
    except ResolverError as exc:
        return Outcome(None, (*reasons, _reason(exc)))
    except EnvbuilderError as exc:
        return Outcome(None, (*reasons, Reason("plan", exc.message)))
    build_text = _build_of(plan.resolution.torch, plan.resolution.variant) if plan.resolution else None
    if plan.container is not None:
        build_text = f"image {plan.container.pick.ref.text}"
    return Outcome(build_text, tuple(reasons))


def _reason(err: ResolverError) -> Reason:
    return Reason(_CAUSES.get(err.gate, err.gate), err.message)


def _build_of(torch: Any, variant: Any) -> str:
    return f"torch {torch} {variant}"


def missing_modules(load: Sequence[str], facts: HostFacts) -> list[Reason]:
    """The modules of ``load`` the node does not offer (nothing where its modules are unknown). An unversioned
    name is offered where any version of it is."""
    if facts.modules is None:
        return []
    offered = set(facts.modules)
    names = {m.split("/", 1)[0] for m in facts.modules}
    out = []
    for mod in load:
        found = mod in offered if "/" in mod else mod in names
        if not found:
            versions = sorted(m for m in facts.modules if m.split("/", 1)[0] == mod.split("/", 1)[0])
            there = f" (it offers {', '.join(versions)})" if versions else ""
            out.append(Reason("module", f"module {mod} is not among the node's modules{there}"))
    return out


# ---------------------------------------------------------------------------------------------------------------
# An env's record: does the build it has still run there


def record_outcome(
    plan: Mapping[str, Any], python: Optional[str], facts: HostFacts, matrix: Optional[Matrix]
) -> Outcome:
    """Whether the torch build a recorded ``plan`` installed (and the modules it loads) run on ``facts``, with
    the env's own ``python``: the release and variant it holds put through the runtime gates."""
    modules = [str(m) for m in plan.get("modules") or ()]
    reasons = missing_modules(modules, facts)
    torch = plan.get("torch")
    if not isinstance(torch, dict) or not torch.get("torch") or not torch.get("variant"):
        return Outcome(None, tuple(reasons))
    build_text = _build_of(torch["torch"], torch["variant"])
    request = TorchRequest(
        version=str(torch["torch"]),
        variant=str(torch["variant"]),
        channel=str(torch.get("channel") or "stable"),
        packages=("torch",),
        torchvision=None,
        torchaudio=None,
    )
    target = replace(facts, python=python) if python else facts
    try:
        resolve(request, target, matrix)
    except ResolverErrors as exc:
        errors: list[ResolverError] = exc.errors
    except ResolverError as exc:
        errors = [exc]
    else:
        errors = []
    reasons += [_reason(e) for e in errors if e.gate in RUNTIME_GATES]
    return Outcome(build_text, tuple(reasons))


# ---------------------------------------------------------------------------------------------------------------
# The report


@dataclass(frozen=True)
class Impact:
    before_from: str
    after_from: str
    verdicts: tuple[Verdict, ...]
    #: Where the torch facts came from (an index read, or the shipped table and why).
    notes: tuple[str, ...] = ()

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(1 for v in self.verdicts if v.status == s) for s in STATUSES}

    @property
    def breaks(self) -> bool:
        return any(v.status == BREAKS for v in self.verdicts)

    def to_json(self) -> dict[str, Any]:
        return {
            "before": self.before_from,
            "after": self.after_from,
            "counts": self.counts,
            "breaks": self.breaks,
            "notes": list(self.notes),
            "subjects": [v.to_json() for v in self.verdicts],
        }
