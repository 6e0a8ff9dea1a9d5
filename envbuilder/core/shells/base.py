"""What a shell adapter says (pure): the script language it speaks (:class:`Syntax`: its template file under
``envbuilder/data/activate``, how a value is quoted, which scripts an env holds for it) and the shell a user
runs (:class:`Shell`: its name, the names ``$SHELL`` may give it, the line that activates an env, its tab
completion). Everything else (``activate_scripts``, ``activation``, ``image``, ``completion``, the CLI's choices)
reads these from :mod:`envbuilder.core.shells.registry` and names no shell itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, Optional

from envbuilder.core.structs import dataclass

#: How an env built as a venv gets a syntax's ``bin/activate`` script: every venv tool writes one, envbuilder
#: appends its hook (ALWAYS); some venv tools write one, hooked where present (IF_PRESENT); or envbuilder writes
#: the whole script, the venv's (if any) replaced (OWN: a shell whose deactivate cannot be wrapped).
ALWAYS = "always"
IF_PRESENT = "if_present"
OWN = "own"
VENV_HOOKS = (ALWAYS, IF_PRESENT, OWN)

#: A completer for one kind of name: given the shell function's name and the command that prints the names (its
#: stderr the completer's to silence), what shtab attaches to the argument and the code it puts before the script
#: (None: none needed).
Completer = Callable[[str, str], "tuple[str, Optional[str]]"]


def _no_entry(name: str) -> str:
    raise ValueError(f"this shell has no way to define the command {name}")


@dataclass(frozen=True)
class Syntax:
    """A script language: its template file, its quoting and the scripts an env holds for it."""

    #: The template file under ``envbuilder/data/activate``.
    template: str
    quote: Callable[[str], str]
    #: Text safe inside the shell's double quotes (messages that name a value).
    dquote: Callable[[str], str]
    #: How the names of its scripts end (``envbuilder/activate.SUFFIX``, conda's ``activate.d/*.SUFFIX``).
    suffix: str
    #: The name of its activate script in the env's ``bin``.
    activate: str
    #: How a venv gets that script (:data:`VENV_HOOKS`).
    venv: str = ALWAYS
    #: Its ``deactivate`` is an alias that sources ``envbuilder/deactivate.SUFFIX`` (no functions to wrap).
    undo_script: bool = False
    #: conda's shell module defines ``conda`` for it, so the extension runs a recipe's ``conda activate``
    #: (elsewhere the extension only says where it would run).
    runs_conda: bool = False
    #: Envs built before envbuilder wrote this syntax's scripts have none: the activate line says so.
    added_later: bool = False
    #: The command that reads a script into the running shell.
    source: str = "source"
    #: A command named NAME that runs the words ARGV (unquoted) followed by its own arguments: a function (csh: an
    #: alias); ValueError where the shell cannot carry a word.
    entry: Callable[[str, Sequence[str]], str] = lambda name, argv: _no_entry(name)

    @property
    def activate_rel(self) -> str:
        return f"bin/{self.activate}"

    @property
    def extension_rel(self) -> str:
        """envbuilder's extension, which the activate script sources."""
        return f"envbuilder/activate.{self.suffix}"

    @property
    def undo_rel(self) -> str:
        """The script an :attr:`undo_script` syntax's deactivate alias sources."""
        return f"envbuilder/deactivate.{self.suffix}"

    @property
    def conda_rels(self) -> tuple[str, str]:
        """The activate.d and deactivate.d scripts conda's activator for this syntax runs."""
        return (
            f"etc/conda/activate.d/envbuilder.{self.suffix}",
            f"etc/conda/deactivate.d/envbuilder.{self.suffix}",
        )

    @property
    def sourced(self) -> tuple[str, ...]:
        """What the activate script sources in turn (a venv's extension, a conda env's activate.d), where it is."""
        return (self.extension_rel, self.conda_rels[0])

    @property
    def image_needs(self) -> Optional[str]:
        """What an env's image must hold for the script written beside its mount to work (None: every env has
        it): the undo its deactivate sources, or the activate script it sources."""
        if not self.added_later:
            return None
        return self.undo_rel if self.undo_script else self.activate_rel

    def line(self, path: str) -> str:
        """The line that reads the script at ``path`` into the shell."""
        return f"{self.source} {self.quote(path)}"


@dataclass(frozen=True)
class Shell:
    """A shell a user runs: ``envbuilder activate --shell NAME`` and ``envbuilder completion NAME``."""

    name: str
    syntax: Syntax
    #: Other names ``$SHELL`` may end in for a shell that runs this one's scripts (csh for tcsh).
    aliases: tuple[str, ...] = ()
    #: An interactive line may end in a ``# comment`` (the image's activate line says how the image is used).
    comments: bool = True
    #: Its tab completion, where shtab writes it (None: ``envbuilder completion`` does not offer it).
    completer: Optional[Completer] = None
    #: What the script shtab writes for it needs put right, if anything (the script in, the script out).
    finish_completion: Optional[Callable[[str], str]] = None
    #: Where a user keeps the completion script (the example in ``envbuilder completion --help``).
    completion_file: str = ""
