"""``python -m kvtier._tools.modelcheck`` (same as ``kvtier check``)."""

import sys

from kvtier._tools.modelcheck.cli import main

sys.exit(main())
