"""atheris harness: the rack mapping parsers (JSON, Pulsar znode, script output; YAML refused).

Run by `make fuzz`, or by hand (see fuzz/README.md):
`.venv/bin/python fuzz/fuzz_racks.py CORPUS_DIR -max_total_time=60`.
"""

from harness import main

if __name__ == "__main__":
    main(["racks"])
