"""``python -m benchmarks.adaptive``."""

import sys

from benchmarks.adaptive.cli import main

if __name__ == "__main__":
    sys.exit(main())
