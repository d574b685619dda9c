"""``python -m shoal.perf``: the same load generator as ``shoal perf``."""

import sys

from shoal.perf.cli import main

sys.exit(main())
