"""The grammar of the commands about sites, recipes and envbuilder itself (impact, probe, report, recipes,
publish, config, docs, man); :mod:`envbuilder.cli.parser` registers them in the order ``--help`` lists them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from envbuilder.cli.options import add_index, env_verb
from envbuilder.cli.parts import Choices, Parser, add_json, command, seconds
from envbuilder.core.shells import registry as shells

if TYPE_CHECKING:
    from envbuilder.cli.parts import Sub


def add_impact(sub: Sub) -> None:
    p = sub.add_parser(
        "impact", help="what a planned node change (driver, OS, modules) breaks, before it is made"
    )
    p.add_argument("--facts", required=True, metavar="FILE", help="the node's facts after the change (JSON)")
    p.add_argument("--before", metavar="FILE", help="the node's facts now (default: probe this node)")
    p.add_argument(
        "--registry", metavar="DIR", help="re-plan every published version here (default: shipped)"
    )
    p.add_argument("--records", metavar="DIR", help="also judge the env records users shared here")
    p.add_argument(
        "--format",
        choices=("text", "html", "md"),
        default="text",
        help="the table as text, as a self-contained HTML page, or as Markdown for tickets",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="with --format html or md: write it to FILE")
    add_index(p)
    add_json(p)
    p.set_defaults(handler=command("impact", "handle"))
    e = env_verb(
        sub, "share", "copy an env's record to the site (impact reads it)", command("envs", "handle_share")
    )
    e.add_argument("--to", required=True, metavar="DIR", help="the site's directory of shared records")


def add_probe(sub: Sub) -> None:
    p = sub.add_parser("probe", help="print this machine's facts (arch, glibc, driver, GPUs, scheduler)")
    p.add_argument("--modules", action="store_true", help="also list the modules `module avail` offers")
    add_json(p)
    p.set_defaults(handler=command("probe", "handle"), probes_host=True)


def add_report(sub: Sub) -> None:
    p = sub.add_parser(
        "report", help="the validation history of envs as one HTML page (plots inline) or Markdown tables"
    )
    p.add_argument("env", nargs="*", metavar="ENV", help="envs to report on")
    p.add_argument("--all", action="store_true", help="every env with a validation history")
    p.add_argument(
        "--site",
        action="store_true",
        help="every user's envs of the site's published recipes, per recipe (the history_dir store)",
    )
    p.add_argument("--recipe", metavar="NAME", help="with --site: only this recipe's envs")
    p.add_argument(
        "--format",
        choices=("html", "md"),
        default="html",
        help="a self-contained HTML page, or Markdown for tickets",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE (default: stdout)")
    p.set_defaults(handler=command("report", "handle"), json=False)


def add_recipes(sub: Sub) -> None:
    p = sub.add_parser("recipes", help="list and inspect recipes")
    rsub = p.add_subparsers(dest="recipes_command", metavar="ACTION", parser_class=Parser)
    r = rsub.add_parser("list", help="every recipe on the search path")
    add_json(r)
    r.set_defaults(handler=command("recipes", "handle_list"))
    r = rsub.add_parser("show", help="a recipe's effective values")
    r.add_argument("recipe")
    r.add_argument(
        "--explain",
        action="store_true",
        help="show the file each value came from, and the torch facts' source",
    )
    add_index(r)
    add_json(r)
    r.set_defaults(handler=command("recipes", "handle_show"))
    r = rsub.add_parser("schema", help="print the recipe JSON schema (for editors)")
    r.set_defaults(handler=command("recipes", "handle_schema"), json=False)
    r = rsub.add_parser("diff", help="what changed between two published versions of a recipe")
    r.add_argument("recipe")
    r.add_argument("old", metavar="A")
    r.add_argument("new", metavar="B")
    add_json(r)
    r.set_defaults(handler=command("publish", "handle_diff"))
    r = rsub.add_parser("update", help="the latest published versions, and your envs built from older ones")
    add_json(r)
    r.set_defaults(handler=command("publish", "handle_update"))
    p.set_defaults(handler=None, subparser=p)


def add_publish(sub: Sub) -> None:
    p = sub.add_parser(
        "publish", help="(site admins) validate recipes and publish them, versioned, to a registry"
    )
    p.add_argument("recipes", nargs="+", metavar="RECIPE", help="recipe names or .toml files")
    p.add_argument(
        "--registry", required=True, metavar="DIR", help="the registry directory (created if absent)"
    )
    p.add_argument(
        "--sign-key", metavar="KEY", help="OpenSSH private key to sign each file with (ssh-keygen -Y)"
    )
    p.add_argument(
        "--allowed-signers",
        metavar="FILE",
        help="ship this allowed-signers file with the registry (ssh-keygen format)",
    )
    p.add_argument(
        "--require-signatures", action="store_true", help="from now on, users refuse unsigned recipes from it"
    )
    p.add_argument("--facts", metavar="FILE", help="also plan each recipe against these host facts")
    p.add_argument(
        "--lock",
        action="append",
        default=[],
        metavar="FILE",
        help="ship this lockfile with its recipe (it must have been made from the recipe as published)",
    )
    p.add_argument(
        "--wait", type=seconds, default=60.0, metavar="SECONDS", help="wait for another publish (default 60)"
    )
    add_json(p)
    p.set_defaults(handler=command("publish", "handle_publish"))


def add_config(sub: Sub) -> None:
    from envbuilder.core.config import PRECEDENCE  # noqa: PLC0415 - pure text, from the precedence's one home

    p = sub.add_parser(
        "config",
        help="the effective settings, and where each comes from (flag, env, file, default)",
        description=PRECEDENCE,
    )
    csub = p.add_subparsers(dest="config_command", metavar="ACTION", parser_class=Parser)
    c = csub.add_parser("list", help="the effective settings with their sources (the default action)")
    add_json(c)
    c.set_defaults(handler=command("config", "handle_list"))
    add_json(p)
    p.set_defaults(handler=command("config", "handle_list"))


def add_docs(sub: Sub) -> None:
    """completion and man, and the hidden command completion scripts call back for names (no help: not listed)."""
    p = sub.add_parser(
        "completion", help=f"print the tab-completion script for {shells.in_words(shells.COMPLETED)}"
    )
    p.add_argument(
        "shell",
        nargs="?",
        choices=Choices("envbuilder.core.shells.registry", "COMPLETED"),
        metavar="SHELL",
        help="%(choices)s (default: the one $SHELL names)",
    )
    # Neither reads a setting: they print without reading the config files.
    p.set_defaults(handler=command("docs", "handle_completion"), reads_settings=False)
    p = sub.add_parser("man", help="print the envbuilder man page (roff)")
    p.set_defaults(handler=command("docs", "handle_man"), reads_settings=False)
    p = sub.add_parser("__complete")
    p.add_argument("kind", choices=Choices("envbuilder.cli.completion", "KINDS"), metavar="KIND")
    p.set_defaults(handler=command("docs", "handle_names"))
