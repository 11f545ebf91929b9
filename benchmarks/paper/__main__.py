"""``python -m benchmarks.paper``."""

import sys

from benchmarks.paper.cli import main

if __name__ == "__main__":
    sys.exit(main())
