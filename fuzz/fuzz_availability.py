"""atheris harness: the GET_LIST_OF_ENTRIES availability decoder.

Run by `make fuzz`, or by hand (see fuzz/README.md):
`.venv/bin/python fuzz/fuzz_availability.py CORPUS_DIR -max_total_time=60`.
"""

from harness import main

if __name__ == "__main__":
    main(["availability"])
