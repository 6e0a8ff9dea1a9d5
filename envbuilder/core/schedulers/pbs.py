"""The PBS adapter: ``#PBS`` directives, ``qsub``/``qstat``/``qdel``, the job's host file
(``$PBS_NODEFILE``) and the site's node launcher to reach every node. Nothing outside this module names PBS or its
variables (tests/unit/test_scheduler_seam.py checks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

from envbuilder.core.launchers import LaunchSpec, build, plain
from envbuilder.core.schedulers.base import (
    HostList,
    JobRecord,
    JobShape,
    Scheduler,
    Where,
    count,
    signal_words,
)


class Pbs(Scheduler):
    name = "pbs"
    title = "PBS"
    allocation_vars = ("PBS_JOBID", "PBS_NODEFILE", "PBS_QUEUE")
    hosts_var = "PBS_NODEFILE"
    directive = "#PBS"
    submit_tool = "qsub"
    job_id_var = "PBS_JOBID"
    partition_var = "PBS_QUEUE"
    node_launcher = "mpiexec"
    setup = ('cd "${PBS_O_WORKDIR:-$PWD}"',)
    first_host = 'MASTER_ADDR=$(head -n 1 "$PBS_NODEFILE")'
    cpus_var = "NCPUS"

    def where(self, env: Mapping[str, str]) -> Where:
        # PBS tells the node count only through $PBS_NODEFILE (locate counts it; the runner reads the file).
        # NCPUS is the first chunk's.
        return Where(
            scheduler=self.name,
            job=env[self.job_id_var],
            cpus_per_node=count(env.get("NCPUS")),
            partition=env.get(self.partition_var) or None,
            # No job variable is known to count a chunk's GPUs: CUDA_VISIBLE_DEVICES tells (locate).
        )

    def hosts(self, env: Mapping[str, str]) -> Optional[HostList]:
        # One line per rank slot; the node count is the count of distinct lines (locate).
        path = env.get(self.hosts_var)
        return HostList(path=path) if path else None

    def on_each_node(self, here: Where, command: Sequence[str]) -> list[str]:
        # No step of its own: the job's remote start, the site's node launcher (one task per node).
        spec = LaunchSpec(python=command[0], script=tuple(command), nodes=here.nodes or 1, direct=True)
        return plain(build(self.node_launcher, spec))

    def unstageable(self, here: Where) -> Optional[tuple[str, str]]:
        if here.nodes:
            return None
        return (
            "envbuilder stage in a PBS job copies the image to the hosts of $PBS_NODEFILE, which is unset or "
            "unreadable here",
            "run it in the job's own shell or script, where PBS sets PBS_NODEFILE",
        )

    def directives(self, job: JobShape, gpu_request: str, required: Sequence[str]) -> list[str]:
        flags = [f"-N {job.name}", f"-l select={job.nodes}", f"-l walltime={job.walltime}"]
        if job.partition:
            flags.append(f"-q {job.partition}")
        if job.account:
            flags.append(f"-A {job.account}")
        return flags + list(required)

    def node_options(self, job: JobShape, gpu_request: str = "none") -> list[str]:
        # One chunk per node, its CPUs and GPUs on the same select (cpu_options and gpu_options add none).
        chunk = [f"select={job.nodes}"]
        if job.cpus_per_task:
            chunk.append(f"ncpus={job.cpus_per_task * job.tasks_per_node}")
        if job.gpus_per_node and gpu_request != "none":
            chunk.append(f"ngpus={job.gpus_per_node}")
        return ["-l", ":".join(chunk)]

    def place_options(self, job: JobShape) -> list[str]:
        flags = ["-l", f"walltime={job.walltime}"]
        if job.partition:
            flags += ["-q", job.partition]
        if job.account:
            flags += ["-A", job.account]
        return flags

    def allocate(self, job: JobShape, gpu_request: str, required: Sequence[str]) -> Optional[list[str]]:
        return ["qsub", "-I", *self.resources(job, gpu_request, required)]

    def batch(
        self, job: JobShape, gpu_request: str, required: Sequence[str], script: str
    ) -> Optional[list[str]]:
        return ["qsub", "-N", job.name, *self.resources(job, gpu_request, required), script]

    def submit(self, script: str, output: str) -> list[str]:
        return ["qsub", "-o", output, "-j", "oe", script]

    def output_problem(self, path: str) -> Optional[str]:
        # qsub reads -o as [HOST:]PATH.
        return "qsub would read the part before ':' as a host name" if ":" in path else None

    def state_query(self, job: str) -> list[str]:
        return ["qstat", job]

    def state(self, returncode: int, stdout: str) -> Optional[str]:
        if returncode != 0:
            return None
        lines = stdout.strip().splitlines()
        return lines[-1].split()[4] if lines and len(lines[-1].split()) > 4 else "Q"

    def cancel(self, job: str) -> list[str]:
        return ["qdel", job]

    def ending(self, record: JobRecord) -> Optional[str]:
        # Exit_status: the script's status; above 256, 256 + the signal PBS ended it with (a walltime or memory
        # limit, qdel); 128 + N, a signal its shell saw; negative, PBS could not start or run it (codes differ
        # between PBS versions: the server's log says which).
        status = record.exit_code or ""
        if not status.lstrip("-").isdigit():
            return None
        number = int(status)
        if number < 0:
            return (
                f"Exit_status {status}: PBS itself could not start or run the job (the server's log says why)"
            )
        if number > 256:
            return f"Exit_status {status}: {signal_words(number - 256)} (sent by PBS)"
        if 128 < number < 160:
            return f"Exit_status {status}: {signal_words(number - 128)}"
        return None

    def record_queries(self, job: str) -> list[list[str]]:
        # -x: finished jobs too, for as long as the server keeps their history (job_history_duration).
        return [["qstat", "-x", "-f", job]]

    def job_record(self, job: str, argv: Sequence[str], stdout: str) -> Optional[JobRecord]:
        fields = _qstat_fields(stdout)
        if not fields.get("Job Id"):
            return None
        # Output_Path is HOST:PATH; with Join_Path oe (envbuilder's qsub -j oe) the error stream is in it too.
        outputs = [_path(fields.get("Output_Path", ""))]
        if fields.get("Join_Path", "n") == "n":
            outputs.append(_path(fields.get("Error_Path", "")))
        variables = dict(
            item.split("=", 1) for item in fields.get("Variable_List", "").split(",") if "=" in item
        )
        return JobRecord(
            job=fields["Job Id"],
            source="qstat -x -f",
            state=fields.get("job_state") or None,
            exit_code=fields.get("Exit_status") or None,
            nodes=fields.get("exec_host") or None,
            outputs=tuple(o for o in outputs if o),
            workdir=variables.get("PBS_O_WORKDIR") or None,
            variables=variables,
        )


def _qstat_fields(stdout: str) -> dict[str, str]:
    """``qstat -f``'s ``Job Id: ID`` and ``key = value`` lines; a long value goes on in lines that start with a
    tab, which are joined to it."""
    fields: dict[str, str] = {}
    key = None
    for line in stdout.splitlines():
        if line.startswith("Job Id:"):
            fields["Job Id"] = line.split(":", 1)[1].strip()
        elif line.startswith("\t") and key:
            fields[key] += line.strip()
        elif " = " in line:
            key, value = (part.strip() for part in line.split(" = ", 1))
            fields[key] = value
    return fields


def _path(value: str) -> str:
    """The path of PBS's ``HOST:PATH``."""
    return value.split(":", 1)[1] if ":" in value else value


#: The adapter the registry offers.
SCHEDULER = Pbs()
