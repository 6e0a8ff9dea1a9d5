"""Validation: the runner that starts a plan's suite of checks (what it launches, and the job script around it, are
``plan.suite``'s and ``plan.batch``'s; the launchers and schedulers ``core``'s) and collects each rank's record,
the user's own program under the same launch (``program``), the report and the ranks' GPU affinity."""
