"""atheris harness: the config loaders (TOML, bk_server.conf, --set, environment).

Run by `make fuzz`, or by hand (see fuzz/README.md):
`.venv/bin/python fuzz/fuzz_config.py CORPUS_DIR -max_total_time=60`.
"""

from harness import main

if __name__ == "__main__":
    main(["config"])
