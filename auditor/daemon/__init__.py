"""The long-running auditor: election, the leader's schedules, the admin API, metrics."""
