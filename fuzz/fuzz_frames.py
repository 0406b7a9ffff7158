"""atheris harness: bookie frame streams and v3 responses (availability, entry bodies, LAC).

Run by `make fuzz`, or by hand (see fuzz/README.md):
`.venv/bin/python fuzz/fuzz_frames.py CORPUS_DIR -max_total_time=60`.
"""

from harness import main

if __name__ == "__main__":
    main(["frames"])
