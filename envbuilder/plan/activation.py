"""What activating an env loads and sets (pure): planned from the recipe, recorded with the env, rendered into
activate scripts and modulefiles by ``envbuilder.backends.activation``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Optional

from envbuilder.core.errors import RecipeError
from envbuilder.core.kinds import kind_info
from envbuilder.core.records import RecordedActivate, RecordedPlan
from envbuilder.core.structs import dataclass
from envbuilder.core.values import (
    require_carriable,
    require_conda_env,
    require_module_name,
    require_path_entry,
    require_var_name,
)

if TYPE_CHECKING:
    # Only named: the loader reaches the registry (ssh-keygen), which a pure module must not import.
    from envbuilder.recipe import sections
    from envbuilder.recipe.loader import Recipe

#: Directories put into colon-separated list variables, by variable, in the order they appear there.
Paths = Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class Activation:
    """The modules (in the order they load) and ``module use`` paths activate loads, the variables it sets and unsets, the directories it
    puts first (``prepend``) or last (``append``) in colon-separated list variables, and (for the renderer) the
    module system's init directory and the recipe's name. Values from a state record come here too, so it
    refuses what no script can carry, whatever the loader checked.

    ``conda_env`` is what ``conda activate`` is run on once the modules are loaded (ALCF's ``module load conda;
    conda activate``), and ``conda deactivate`` undoes it: the ``conda`` shell function comes from a module.

    A list variable is only ever added to, never also set or unset: deactivate takes out exactly the entries
    activate added and leaves the rest of the value (and what the user added meanwhile) alone, which a
    wholesale restore of the same variable would undo."""

    module_use: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    prepend: Paths = field(default_factory=dict)
    append: Paths = field(default_factory=dict)
    #: The env_profiles whose variables ``env`` and ``unset`` hold (recorded; the scripts need only the values).
    profiles: tuple[str, ...] = ()
    #: The conda env ``conda activate`` is run on after the modules load (a name or an absolute prefix).
    conda_env: Optional[str] = None
    #: Which of ``modules`` are the env's build modules (``[modules] load`` but those marked build-only), the rest
    #: being ``activate.modules``' additions; None where a record from before activation loaded the build's
    #: modules holds only those additions in ``modules``.
    from_build: Optional[tuple[str, ...]] = None
    #: The module system's init directory (holding bash, zsh, ...), used when the user's shell has no ``module``.
    module_init: Optional[str] = None
    recipe: str = ""

    def __post_init__(self) -> None:
        """Refuse what the script cannot carry (RecipeError, naming the key)."""
        for key, value in dict(self.env).items():
            require_var_name(key, "activate.env")
            require_carriable(value, f"activate.env.{key}")
        for i, name in enumerate(self.unset):
            require_var_name(name, f"unset[{i}]")
        for how, paths in (("prepend", self.prepend), ("append", self.append)):
            for var, entries in dict(paths).items():
                require_var_name(var, f"activate.{how}")
                for i, entry in enumerate(entries):
                    require_path_entry(entry, f"activate.{how}.{var}[{i}]")
                if var in self.env or var in self.unset:
                    raise RecipeError(
                        f"{var} is both set (or unset) and a list activate adds to ({how})",
                        key=f"activate.{how}.{var}",
                        hint="either set the whole value or add directories to it, not both",
                    )
        for i, path in enumerate(self.module_use):
            require_carriable(path, f"modules.use[{i}]")
            if path.startswith("-"):
                raise RecipeError(
                    f"a `module use` path cannot start with '-', found {path!r}", key=f"modules.use[{i}]"
                )
        for i, name in enumerate(self.modules):
            require_module_name(name, f"activate.modules[{i}]")
        if any(name not in self.modules for name in self.from_build or ()):
            raise RecipeError(
                "activation's build modules must be among the modules it loads", key="from_build"
            )
        if self.conda_env is not None:
            require_conda_env(self.conda_env, "activate.conda_env")
        for key, value in (("module system init", self.module_init or ""), ("recipe.name", self.recipe)):
            require_carriable(value, key)

    def to_json(self) -> RecordedActivate:
        return {
            "modules": list(self.modules),
            "module_use": list(self.module_use),
            "env": dict(self.env),
            "unset": list(self.unset),
            "prepend": {k: list(v) for k, v in self.prepend.items()},
            "append": {k: list(v) for k, v in self.append.items()},
            "profiles": list(self.profiles),
            "conda_env": self.conda_env,
            **({"from_build": list(self.from_build)} if self.from_build is not None else {}),
        }

    @classmethod
    def of_record(cls, plan: RecordedPlan) -> Optional[Activation]:
        """What activating an env loads and sets, as its recorded plan says (None for a record without)."""
        recorded = plan.get("activate")
        return cls.from_json(recorded) if recorded else None

    @classmethod
    def from_json(cls, data: RecordedActivate) -> Activation:
        return cls(
            module_use=tuple(data.get("module_use") or ()),
            modules=tuple(data.get("modules") or ()),
            env=dict(data.get("env") or {}),
            unset=tuple(data.get("unset") or ()),
            prepend={k: tuple(v) for k, v in (data.get("prepend") or {}).items()},
            append={k: tuple(v) for k, v in (data.get("append") or {}).items()},
            profiles=tuple(data.get("profiles") or ()),
            conda_env=data.get("conda_env"),
            from_build=tuple(data["from_build"]) if data.get("from_build") is not None else None,
        )

    def modules_said(self, built_with: Sequence[str] = (), build_only: Sequence[str] = ()) -> str:
        """Which modules activation loads and deactivate unloads, and why each, in words for the plan, ``show``
        and the modulefile. ``built_with``: the env's build modules (``[modules] load``); ``build_only``: those
        the build loads that activation leaves out."""
        added = [m for m in self.modules if m not in (self.from_build or ())]
        parts = []
        if self.from_build:
            parts.append(f"{' '.join(self.from_build)} (the build's, [modules] load)")
        if added:
            parts.append(f"{' '.join(added)} ([activate] modules)")
        said = f"loads {', then '.join(parts)}" if parts else "loads no module"
        if self.modules:
            said += "; deactivate unloads those of them (and what they loaded) that were not loaded before"
        left = [m for m in build_only if m not in self.modules]
        if left:
            said += f"; not loaded: {' '.join(left)} (build only)"
        missed = [m for m in built_with if m not in self.modules and m not in build_only]
        if self.from_build is None and missed:
            said += (
                f"; not loaded: {' '.join(missed)}, which the env was built with (recorded before activation "
                "loaded the build's modules; `envbuilder create NAME --force` rewrites it)"
            )
        return said

    def apply(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with the variables set and unset, then the directories put first and last (no empty entry:
        to the loader and the shell that is the current directory)."""
        out = {**env, **self.env}
        for var in self.unset:
            out.pop(var, None)
        for var, entries in self.prepend.items():
            out[var] = ":".join([*entries, *([out[var]] if out.get(var) else [])])
        for var, entries in self.append.items():
            out[var] = ":".join([*([out[var]] if out.get(var) else []), *entries])
        return out


def activated_build_modules(modules: sections.Modules) -> tuple[str, ...]:
    """The build modules activation loads too: ``[modules] load`` in its order, but those ``build_only`` marks.
    The env's python, its MPI and their libraries come from them (a site-built python finds its libpython
    only through its module's LD_LIBRARY_PATH)."""
    return tuple(m for m in modules.load if m not in modules.build_only)


def build_loads(modules: Sequence[str], build_only: Sequence[str]) -> list[str]:
    """What the build loads, in order: the build modules, then the build-only ones not among them (a
    ``build_only`` entry may name one of ``load`` only to keep it out of activation)."""
    return list(dict.fromkeys([*modules, *build_only]))


def activation_for(recipe: Recipe) -> Activation:
    """What activating an env of ``recipe`` loads and sets: the build's modules (but the build-only ones), then
    those ``activate.modules`` adds, once each; variables, unsets, list entries. Profiles adding to the same list
    variable add in the order ``activate.profiles`` names them."""
    env: dict[str, str] = {}
    unset: list[str] = []
    prepend: dict[str, tuple[str, ...]] = {}
    append: dict[str, tuple[str, ...]] = {}
    for name in recipe.activate.profiles:
        profile = recipe.env_profiles[name]
        env.update(profile.set)
        unset.extend(profile.unset)
        for var, entries in profile.prepend.items():
            prepend[var] = (*prepend.get(var, ()), *entries)
        for var, entries in profile.append.items():
            append[var] = (*append.get(var, ()), *entries)
    env.update(recipe.activate.env)
    from_build = activated_build_modules(recipe.modules)
    return Activation(
        module_use=recipe.modules.use,
        modules=(*from_build, *(m for m in recipe.activate.modules if m not in from_build)),
        from_build=from_build,
        env=env,
        unset=tuple(unset),
        prepend=prepend,
        append=append,
        profiles=recipe.activate.profiles,
        conda_env=None if _is_a_conda_env(recipe) else recipe.activate.conda_env,
        recipe=recipe.name,
    )


def _is_a_conda_env(recipe: Recipe) -> bool:
    """A conda env (or a clone of the site's): activating it takes the place of the conda env the recipe's
    ``activate.conda_env`` names, as ``conda activate`` of one env leaves the one before."""
    kind = kind_info(recipe.env.kind)
    return kind.conda or (kind.overlay and recipe.env.overlay == "clone")
