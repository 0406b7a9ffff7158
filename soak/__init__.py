"""A long run of the daemons under random faults (`make soak`); see docs/reliability.md."""
