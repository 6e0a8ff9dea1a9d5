"""What activating an env loads and sets (pure): planned from the recipe, recorded with the env, rendered into
activate scripts and modulefiles by ``envbuilder.activation``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional, TypedDict

from envbuilder.errors import RecipeError
from envbuilder.recipe.schema import require_carriable, require_module_name, require_var_name


class RecordedActivate(TypedDict, total=False):
    """An Activation as a recorded plan holds it (records from older releases may lack keys)."""

    modules: list[str]
    module_use: list[str]
    env: dict[str, str]
    unset: list[str]
    profiles: list[str]


@dataclass(frozen=True)
class Activation:
    """The modules and ``module use`` paths activate loads, the variables it sets and unsets, and (for the
    renderer) the module system's init directory and the recipe's name. Values from a state record come here
    too, so it refuses what no script can carry, whatever the loader checked."""

    module_use: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    #: The env_profiles whose variables ``env`` and ``unset`` hold (recorded; the scripts need only the values).
    profiles: tuple[str, ...] = ()
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
        for i, path in enumerate(self.module_use):
            require_carriable(path, f"modules.use[{i}]")
            if path.startswith("-"):
                raise RecipeError(
                    f"a `module use` path cannot start with '-', found {path!r}", key=f"modules.use[{i}]"
                )
        for i, name in enumerate(self.modules):
            require_module_name(name, f"activate.modules[{i}]")
        for key, value in (("module system init", self.module_init or ""), ("recipe.name", self.recipe)):
            require_carriable(value, key)

    def to_json(self) -> RecordedActivate:
        return {
            "modules": list(self.modules),
            "module_use": list(self.module_use),
            "env": dict(self.env),
            "unset": list(self.unset),
            "profiles": list(self.profiles),
        }

    @classmethod
    def from_json(cls, data: RecordedActivate) -> Activation:
        return cls(
            module_use=tuple(data.get("module_use") or ()),
            modules=tuple(data.get("modules") or ()),
            env=dict(data.get("env") or {}),
            unset=tuple(data.get("unset") or ()),
            profiles=tuple(data.get("profiles") or ()),
        )
