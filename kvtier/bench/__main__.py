"""``python -m kvtier.bench`` — same as ``kvtier bench``."""

import sys

from kvtier.bench import main

if __name__ == "__main__":
    sys.exit(main())
