"""`envbuilder explain LOG|JOBID [--env ENV]`: what a failed job's output means. The output (a log file, or the
files a scheduler's record names) is matched against the signature registry (shipped and the site's), each match
tied to the env the job ran where that is known; where nothing matches, it says so and offers ``doctor``."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any, Optional

from envbuilder.core import settings
from envbuilder.core.errors import StateError
from envbuilder.core.schedulers.base import JobRecord
from envbuilder.doctor import explanation, jobs, signatures
from envbuilder.doctor.explanation import EnvFacts, Explanation
from envbuilder.system.console import Out, plain

#: What a job id looks like to every scheduler here (Slurm's 123, 123_4, 123.batch; PBS's 123.server, 123[].server):
#: anything else is a log's name, and no value of another shape reaches a scheduler's command line.
JOB_ID = re.compile(r"[0-9]+(?:[_.\[][A-Za-z0-9_.\[\]-]*)?")


def handle(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    env = dict(os.environ)
    registry = jobs.registry(env)  # first: a broken site file is reported before any job is looked up
    record: Optional[JobRecord] = None
    unanswered: tuple[str, ...] = ()
    scheduler_ending: Optional[str] = None
    files: tuple[str, ...]
    path = Path(args.what)
    if path.exists() or path.is_symlink() or not JOB_ID.fullmatch(args.what):
        output = jobs.read_log(path)
        source = str(path)
        label, files = "a log", (source,)
    else:
        record, scheduler, unanswered = jobs.job_record(args.what, env)
        scheduler_ending = jobs.ending(record, scheduler)
        output = jobs.read_outputs(record, scheduler)
        label, files = f"job {record.job} ({scheduler}, {record.source})", tuple(output.paths)
        source = f"{label}: {', '.join(files)}"
        for missing, why in output.missing:
            out.warn(f"job {record.job}'s {missing} cannot be read: {why}")
    result = Explanation(
        source=source,
        matches=tuple(signatures.match(output.text, registry)),
        env=_env(args.env, record, env, out),
        job=_job_facts(record, scheduler_ending),
        lines=output.text.count("\n") + 1 if output.text else 0,
        cut=output.cut,
        unanswered=unanswered,
        files=files,
    )
    data = result.to_json()
    if not args.json:
        _render(result, label, out)
    return data


def _env(
    name: Optional[str], record: Optional[JobRecord], env: dict[str, str], out: Out
) -> Optional[EnvFacts]:
    """The env the job ran: --env, else the one its variables or script name; None where none is known (or the
    one named is not recorded here: said, and explained without it)."""
    named_by = "--env"
    if name is None and record is not None:
        script = jobs.read_script(record)
        found = explanation.env_in_script(script, record.variables, jobs.env_prefixes(settings.home(env)))
        if found is None:
            return None
        name, named_by = found
    if name is None:
        return None
    try:
        return jobs.env_facts(name, named_by, env)
    except StateError as exc:
        if named_by == "--env":
            raise
        out.warn(f"{named_by} names {name}, which is not recorded here ({exc.message}): explained without it")
        return None


def _job_facts(record: Optional[JobRecord], ending: Optional[str]) -> tuple[tuple[str, str], ...]:
    if record is None:
        return ()
    facts = (
        ("state", record.state),
        ("exit code", record.exit_code),
        ("nodes", record.nodes),
        ("ended by", ending),
    )
    return tuple((k, v) for k, v in facts if v)


def _render(result: Explanation, label: str, out: Out) -> None:
    res = out.result
    res.heading(f"Explaining {label}")
    for path in result.files:
        res.field("read", path)
    for key, value in result.job:
        res.field(key, value)
    if result.env is not None:
        e = result.env
        res.field("env", f"{e.name} (named by {e.named_by}): torch {e.torch or '?'} {e.variant}".rstrip())
    for query in result.unanswered:
        res.line(f"(no answer from {query})")
    if result.cut:
        res.line(f"(only the last {signatures.MAX_TEXT // (1024 * 1024)} MiB of the output were read)")
    for m in result.matches:
        res.line()
        first = m.lines[0][0]
        more = f", {m.count} lines" if m.count > 1 else ""
        res.show(plain("KNOWN ", "bold"), plain(m.signature.id, "bold cyan"), f"  (line {first}{more})")
        width = res.console.width
        for number, text in m.lines:  # the log's own line, cut to the width: the log file holds it whole
            said = f"  {number}: {text}"
            res.line(said if len(said) <= width else said[: width - 3] + "...")
        res.field("means", m.text("means"), prose=True)
        for note in result.notes(m):
            res.field("this env", note, prose=True)
        res.field("fix", m.text("fix"), prose=True)
        res.field("source", m.signature.source)
    step = result.next_step()
    if step:
        res.line()
        res.line(step)
