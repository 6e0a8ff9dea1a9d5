"""Validation: the suite of checks a plan runs, the launchers (pure argv builders), batch scripts for the
schedulers, the runner that starts them and collects each rank's record, and the report."""
