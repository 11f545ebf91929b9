"""``python -m benchmarks.cluster``."""

import sys

from benchmarks.cluster.cli import main

if __name__ == "__main__":
    sys.exit(main())
