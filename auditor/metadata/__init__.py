"""BookKeeper's metadata as stored in ZooKeeper: ledgers, bookies, under-replication."""
