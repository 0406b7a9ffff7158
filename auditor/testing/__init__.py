"""Real parts for tests and the demo: a throwaway ZooKeeper, a cluster writer, bookie emulators."""
