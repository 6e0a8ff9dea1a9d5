"""The Slurm adapter: ``#SBATCH`` directives, ``sbatch``/``squeue``/``scontrol``/``scancel``, a step of the
allocation (``srun``) on every node and ``sbcast`` to copy an image. Nothing outside this module names Slurm or its
variables (tests/unit/test_scheduler_seam.py checks)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Optional

from envbuilder.core import values
from envbuilder.core.launchers import ShellVar
from envbuilder.core.schedulers.base import (
    HostList,
    JobRecord,
    JobShape,
    Scheduler,
    Where,
    count,
    signal_words,
)
from envbuilder.core.shells import registry as shells


class Slurm(Scheduler):
    name = "slurm"
    title = "Slurm"
    allocation_vars = (
        "SLURM_JOB_ID",
        "SLURM_JOB_NODELIST",
        "SLURM_JOB_NUM_NODES",
        "SLURM_NNODES",
        "SLURM_JOB_PARTITION",
        "SLURM_GPUS_ON_NODE",
        "SLURM_NTASKS",
    )
    hosts_var = "SLURM_JOB_NODELIST"
    broadcasts = True
    #: A step (``srun --pty``) gets one CPU unless one of these asks for more.
    step_cpu_options = ("--cpus-per-task", "--cpus-per-gpu", "--exclusive", "--mincpus")
    directive = "#SBATCH"
    submit_tool = "sbatch"
    job_id_var = "SLURM_JOB_ID"
    partition_var = "SLURM_JOB_PARTITION"
    node_launcher = "srun"
    rdzv_id = ShellVar("SLURM_JOB_ID")
    first_host = 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'
    cpus_var = "SLURM_CPUS_ON_NODE"
    #: Those sbatch, salloc and srun agree on.
    short_options = MappingProxyType(
        {
            "-A": "--account",
            "-C": "--constraint",
            "-c": "--cpus-per-task",
            "-D": "--chdir",
            "-d": "--dependency",
            "-e": "--error",
            "-G": "--gpus",
            "-i": "--input",
            "-J": "--job-name",
            "-L": "--licenses",
            "-M": "--clusters",
            "-m": "--distribution",
            "-N": "--nodes",
            "-n": "--ntasks",
            "-o": "--output",
            "-p": "--partition",
            "-q": "--qos",
            "-t": "--time",
            "-w": "--nodelist",
            "-x": "--exclude",
        }
    )

    def where(self, env: Mapping[str, str]) -> Where:
        # A batch script and a step know their node's CPUs; an salloc shell (on the login node) only the
        # allocation's list, "32(x2),16" style.
        cpus = count(env.get("SLURM_CPUS_ON_NODE")) or count(
            env.get("SLURM_JOB_CPUS_PER_NODE", "").split("(")[0]
        )
        return Where(
            scheduler=self.name,
            job=env[self.job_id_var],
            in_step="SLURM_STEP_ID" in env,
            nodes=count(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")),
            cpus_per_node=cpus,
            partition=env.get(self.partition_var) or None,
            gpus=self._gpus(env),
            tasks=count(env.get("SLURM_NTASKS")),
        )

    def _gpus(self, env: Mapping[str, str]) -> Optional[int]:
        """The GPUs Slurm gave the job on this node. A batch script and a step are told (SLURM_GPUS_ON_NODE, the
        indexes in SLURM_STEP_GPUS or SLURM_JOB_GPUS) whenever they hold GPUs as GRES, so one on its node that
        is told nothing holds none; an salloc shell is told only --gpus-per-node's count."""
        told = count(env.get("SLURM_GPUS_ON_NODE"))
        if told is not None:
            return told
        for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
            if env.get(var, "").strip():
                return len([i for i in env[var].split(",") if i.strip()])
        per_node = env.get("SLURM_GPUS_PER_NODE", "")  # "2" or "h100:2"
        if per_node:
            return count(per_node.rsplit(":", 1)[-1])
        return 0 if self.on_node(env) else None

    def hosts(self, env: Mapping[str, str]) -> Optional[HostList]:
        nodelist = env.get(self.hosts_var)
        return HostList(argv=("scontrol", "show", "hostnames", nodelist)) if nodelist else None

    def on_each_node(self, here: Where, command: Sequence[str]) -> list[str]:
        # One task on every node, a step of the allocation (sharing resources when this already runs in a step).
        nodes = here.nodes or 1
        argv = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"]
        return [*argv, "--overlap", *command] if here.in_step else [*argv, *command]

    def broadcast(self, source: str, dest: str) -> list[str]:
        # sbcast: one read of the shared file system, fanned out by Slurm.
        return ["sbcast", "--force", source, dest]

    def on_node(self, env: Mapping[str, str]) -> bool:
        # Slurm sets it in a batch script and a step, on the node; an salloc shell lacks it.
        return "SLURM_CPUS_ON_NODE" in env

    def directives(self, job: JobShape, gpu_request: str, required: Sequence[str]) -> list[str]:
        flags = [
            f"--job-name={job.name}",
            f"--nodes={job.nodes}",
            f"--ntasks={job.nodes * job.tasks_per_node}",
            f"--ntasks-per-node={job.tasks_per_node}",
            f"--time={job.walltime}",
        ]
        if job.partition:
            flags.append(f"--partition={job.partition}")
        if job.account:
            flags.append(f"--account={job.account}")
        if job.cpus_per_task:
            flags.append(f"--cpus-per-task={job.cpus_per_task}")
        if job.gpus_per_node:
            flags += _gpu_flags(job, gpu_request)
        return flags + list(required)

    def node_options(self, job: JobShape, gpu_request: str = "none") -> list[str]:
        return [f"--nodes={job.nodes}", f"--ntasks-per-node={job.tasks_per_node}"]

    def cpu_options(self, job: JobShape) -> list[str]:
        return [f"--cpus-per-task={job.cpus_per_task}"] if job.cpus_per_task else []

    def gpu_options(self, job: JobShape, gpu_request: str) -> list[str]:
        return _gpu_flags(job, gpu_request) if job.gpus_per_node else []

    def place_options(self, job: JobShape) -> list[str]:
        flags = [f"--partition={job.partition}"] if job.partition else []
        if job.account:
            flags.append(f"--account={job.account}")
        return [*flags, f"--time={job.walltime}"]

    def allocate(self, job: JobShape, gpu_request: str, required: Sequence[str]) -> Optional[list[str]]:
        return ["salloc", *self.resources(job, gpu_request, required)]

    def shell(self, job: JobShape, gpu_request: str, required: Sequence[str]) -> Optional[list[str]]:
        # A step: it holds only what it asks for (one CPU unless --cpus-per-task says more).
        return ["srun", *self.resources(job, gpu_request, required), "--pty", shells.default().name, "-i"]

    def batch(
        self, job: JobShape, gpu_request: str, required: Sequence[str], script: str
    ) -> Optional[list[str]]:
        return ["sbatch", f"--job-name={job.name}", *self.resources(job, gpu_request, required), script]

    def submit(self, script: str, output: str) -> list[str]:
        return ["sbatch", "--parsable", f"--output={output}", script]

    output_job_id = "%j"

    def output_literal(self, path: str) -> str:
        return path.replace("%", "%%")

    def output_of(self, output: str, job: str) -> str:
        # %j and %A are the job's id (a job that is no array's), %% a '%'; the other patterns stay as written.
        jobid = job.split(";", 1)[0]
        return re.sub(r"%([%jA])", lambda m: "%" if m.group(1) == "%" else jobid, output)

    def time_left_query(self, job: str) -> Optional[list[str]]:
        return ["squeue", "-h", "-j", job, "-o", "%L"]

    def time_left(self, stdout: str) -> Optional[int]:
        # [D-]HH:MM:SS, MM:SS or "UNLIMITED"/"INVALID".
        text = stdout.strip()
        return values.time_seconds(text if "-" in text or text.count(":") != 1 else f"0:{text}")

    def state_query(self, job: str) -> list[str]:
        # The state, then the reason a pending job waits (squeue's %r).
        return ["squeue", "-h", "-j", job, "-o", "%T %r"]

    def state(self, returncode: int, stdout: str) -> Optional[str]:
        words = stdout.split()
        if returncode != 0 or not words:
            return None
        state, reason = words[0], " ".join(words[1:])
        return f"{state}, {reason}" if state == "PENDING" and reason and reason != "None" else state

    def never_starts(self, stdout: str) -> Optional[str]:
        words = stdout.split()
        if len(words) < 2 or words[0] != "PENDING":
            return None
        reason = words[1].rstrip(",")
        for prefix, why in _NEVER:
            if reason.startswith(prefix):
                return f"{reason}: {why}"
        return None

    def exit_query(self, job: str) -> Optional[list[str]]:
        return ["scontrol", "show", "job", job]

    def exit_code(self, stdout: str) -> Optional[int]:
        for word in stdout.split():
            if word.startswith("ExitCode="):
                return int(word.split("=", 1)[1].split(":", 1)[0])
        return None

    def cancel(self, job: str) -> list[str]:
        return ["scancel", job]

    def ending(self, record: JobRecord) -> Optional[str]:
        # ExitCode is STATUS:SIGNAL, the signal that ended the batch script (0 where none did).
        for state, words in _ENDINGS.items():
            if (record.state or "").startswith(state):
                return f"{state}: {words}"
        parts = (record.exit_code or "").split(":")
        if len(parts) == 2 and parts[1].isdigit() and int(parts[1]):
            return f"exit code {record.exit_code}: {signal_words(int(parts[1]))}"
        return None

    def record_queries(self, job: str) -> list[list[str]]:
        # The accounting database first (it keeps a job for good); without accounting (or once sacct does not
        # know the job) the controller's record, which it keeps for MinJobAge (300 s by default) after the end.
        return [
            [
                "sacct",
                "-j",
                job,
                "-X",
                "-n",
                "-P",
                "-o",
                "JobID,State,ExitCode,NodeList,StdOut,StdErr,WorkDir",
            ],
            ["scontrol", "-o", "show", "job", job],
        ]

    def job_record(self, job: str, argv: Sequence[str], stdout: str) -> Optional[JobRecord]:
        if argv[:1] == ["sacct"]:
            return _sacct_record(job, stdout)
        fields = _scontrol_fields(stdout)
        if not fields.get("JobId"):
            return None
        outputs = [fields.get("StdOut", ""), fields.get("StdErr", "")]
        return JobRecord(
            job=fields["JobId"],
            source="scontrol show job",
            state=fields.get("JobState") or None,
            exit_code=fields.get("ExitCode") or None,
            nodes=fields.get("NodeList") or None,
            outputs=tuple(dict.fromkeys(o for o in outputs if o)),
            script=fields.get("Command") or None,
            workdir=fields.get("WorkDir") or None,
        )


#: Job states that say why a job ended.
_ENDINGS = {
    "OUT_OF_MEMORY": "Slurm's memory limit: a process of the job was killed by the cgroup's OOM killer",
    "TIMEOUT": "its time limit",
    "PREEMPTED": "preemption by another job",
    "NODE_FAIL": "a node of the job failing",
    "CANCELLED": "a cancel (scancel, or an admin)",
}


def _sacct_record(job: str, stdout: str) -> Optional[JobRecord]:
    """sacct -P's line for the job (its allocation, -X): patterns in StdOut/StdErr expanded for the job id."""
    for line in stdout.splitlines():
        parts = line.split("|")
        if len(parts) != 7 or not parts[0]:
            continue
        jobid, state, exit_code, nodes, out, err, workdir = parts
        outputs = [SCHEDULER.output_of(p, jobid) for p in (out, err) if p]
        return JobRecord(
            job=jobid,
            source="sacct",
            state=state.split()[0] if state else None,
            exit_code=exit_code or None,
            nodes=nodes or None,
            outputs=tuple(dict.fromkeys(outputs)),
            workdir=workdir or None,
        )
    return None


def _scontrol_fields(stdout: str) -> dict[str, str]:
    """``scontrol -o show job``'s Key=Value pairs; a value runs to the next `` Key=`` (a path may hold spaces)."""
    line = stdout.strip().splitlines()[0] if stdout.strip() else ""
    return {
        m.group(1): m.group(2)
        for m in re.finditer(r"(?:^| )([A-Za-z][\w:/]*)=(.*?)(?= [A-Za-z][\w:/]*=|$)", line)
    }


#: Pending reasons (squeue's %r) that do not clear while the job and the site stay as they are, and what each means:
#: from Slurm's "Job Reason Codes" page (slurm.schedmd.com/job_reason_codes.html, read 2026-11-28).
_NEVER = (
    ("JobHeld", "the job is held, and waits for `scontrol release`"),
    ("BadConstraints", "the job asks for features or resources no node of the partition has"),
    ("PartitionConfig", "the job asks for more than the partition's configuration allows"),
    ("PartitionTimeLimit", "the job's time limit is over the partition's"),
    ("PartitionNodeLimit", "the job asks for more nodes than the partition allows"),
    ("QOSMaxWallDurationPerJobLimit", "the job's time limit is over its QOS's"),
    ("AssocMaxWallDurationPerJobLimit", "the job's time limit is over its account's"),
    ("InvalidAccount", "the account does not exist or you are not in it"),
    ("InvalidQOS", "the QOS does not exist or you may not use it"),
    ("DependencyNeverSatisfied", "a job it depends on ended in a way that never satisfies the dependency"),
)


def _gpu_flags(job: JobShape, gpu_request: str) -> list[str]:
    """How a Slurm job asks for its GPUs, in the site's dialect (``none``: it does not)."""
    if gpu_request == "gpus-per-node":
        return [f"--gpus-per-node={job.gpus_per_node}"]
    if gpu_request == "gres":
        return [f"--gres=gpu:{job.gpus_per_node}"]
    if gpu_request == "gpus":
        return [f"--gpus={job.gpus_per_node * job.nodes}"]
    return []


#: The adapter the registry offers.
SCHEDULER = Slurm()
