"""``python -m perf``: the same load generator as ``shoal perf``."""

import sys

from perf.cli import main

sys.exit(main())
