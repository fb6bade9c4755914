import sys

from pools.cli import main

sys.exit(main())
