"""A mark only says that a ledger lacks copies; something has to make them, and BookKeeper's
AutoRecovery runs that worker (`ReplicationWorker`) beside the auditor in every process, as
the daemon does.

The replication worker: copies under-replicated fragments to other bookies and commits them.

It sits beside the daemon in the layers: the daemon runs
it; it uses the checks' cores (which entries a bookie lacks, placement), the
bookie client and the metadata layer (locks, marks, versioned metadata writes).
"""
