"""atheris harness: ledger metadata (v1, v2, v3), TextFormat, ZooKeeper records and LAYOUT.

Run by `make fuzz`, or by hand (see fuzz/README.md):
`.venv/bin/python fuzz/fuzz_metadata.py CORPUS_DIR -max_total_time=60`.
"""

from harness import main

if __name__ == "__main__":
    main(["metadata", "textformat", "records", "layout"])
