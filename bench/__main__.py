"""``python -m bench`` (``make bench``): the benchmark suite, run from a checkout."""

import sys

from bench import main

if __name__ == "__main__":
    sys.exit(main())
