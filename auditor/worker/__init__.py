"""The replication worker: copies under-replicated fragments to other bookies and commits them.

BookKeeper's AutoRecovery runs it beside the auditor in every process
(`ReplicationWorker`). It sits beside the daemon in the layers: the daemon runs
it; it uses the checks' cores (which entries a bookie lacks, placement), the
bookie client and the metadata layer (locks, marks, versioned metadata writes).
"""
