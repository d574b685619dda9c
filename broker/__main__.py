import sys

from shoal.broker.cli import main

sys.exit(main())
