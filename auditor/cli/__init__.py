"""The `bk-auditor` command line."""
