"""`python -m auditor` is `bk-auditor`."""

import sys

from auditor.cli.main import main

sys.exit(main())
