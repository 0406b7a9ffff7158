"""The Python file `spark-submit` runs for `bk-auditor scan` and `bk-auditor snapshot`.

spark-submit takes a Python file, not a console script, so this file stands in
for `bk-auditor`: its arguments are the CLI's, starting with the command

    spark-submit [spark options] scan_job.py scan --engine spark --zk HOST:PORT --out DIR

Under spark-submit the scan sets no master of its own (it sees
PYSPARK_GATEWAY_PORT), so spark-submit's `--master` and `--deploy-mode` apply.
The CLI's exit code (0 clean, 1 violations, 2 could not run) becomes the
driver's, which spark-submit reports in client mode.
"""

from __future__ import annotations

import sys

from auditor.cli.main import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
