"""``python -m tools.modelcheck`` (same as ``python -m tools check``)."""

import sys

from tools.modelcheck.cli import main

sys.exit(main())
