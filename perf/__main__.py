"""``python -m perf``: the same load generator as ``shoal perf``."""

import sys

from perf import main

sys.exit(main())
