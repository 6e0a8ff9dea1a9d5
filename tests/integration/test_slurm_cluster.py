"""The test Slurm cluster itself (tests/slurm.py): real batch jobs, a GPU step and a failing job, seen the way the
tool sees a site's Slurm, through sbatch, srun, squeue and scontrol. There is no accounting, so a job's end state
comes from scontrol while the controller still remembers the job."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from slurm import ENDED, MiniCluster, job_record

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

#: Polls give up after this long; a bound so a stuck job fails the test instead of hanging it.
JOB_LIMIT = 120


def submit(cluster: MiniCluster, *args: str, cwd: Path) -> str:
    proc = cluster.client("sbatch", "--parsable", f"--chdir={cwd}", *args)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    assert job_id.isdigit(), proc.stdout
    return job_id


def finished(cluster: MiniCluster, job_id: str) -> dict[str, str]:
    """Waits until the job has ended, then its record from scontrol as key=value pairs."""
    deadline = time.monotonic() + JOB_LIMIT
    while (job := job_record(job_id, cluster.environ())).get("JobState") not in ENDED:
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} has not ended ({job.get('JobState')})\n{cluster.log_tails()}")
        time.sleep(0.1)
    return job


def test_batch_job_runs_and_completes(slurm_cluster: MiniCluster, tmp_path: Path) -> None:
    result = tmp_path / "result.txt"
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH -J envbuilder-test\n"
        "#SBATCH -n 1\n"
        f"#SBATCH -o {tmp_path}/%x-%j.out\n"
        f'echo "job=$SLURM_JOB_ID partition=$SLURM_JOB_PARTITION" > {result}\n'
        "echo hello from the job\n"
    )
    job_id = submit(slurm_cluster, str(script), cwd=tmp_path)

    job = finished(slurm_cluster, job_id)
    assert job["JobState"] == "COMPLETED", job
    assert job["ExitCode"] == "0:0"
    assert result.read_text() == f"job={job_id} partition={slurm_cluster.partition}\n"
    assert (tmp_path / f"envbuilder-test-{job_id}.out").read_text() == "hello from the job\n"


def test_gpu_step_sees_both_fake_gpus(slurm_cluster: MiniCluster) -> None:
    proc = slurm_cluster.client("srun", "-n1", "--gres=gpu:2", "printenv", "CUDA_VISIBLE_DEVICES")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "0,1\n"


def test_asking_for_more_gpus_than_the_node_has_is_refused(slurm_cluster: MiniCluster) -> None:
    proc = slurm_cluster.client("srun", "-n1", "--gres=gpu:3", "true")
    assert proc.returncode != 0
    assert "Requested node configuration is not available" in proc.stderr


def test_failing_job_ends_failed_with_its_exit_code(slurm_cluster: MiniCluster, tmp_path: Path) -> None:
    job_id = submit(slurm_cluster, "--wrap", "exit 3", "-o", "/dev/null", cwd=tmp_path)

    job = finished(slurm_cluster, job_id)
    assert job["JobState"] == "FAILED", job
    assert job["Reason"] == "NonZeroExitCode"
    assert job["ExitCode"] == "3:0"
