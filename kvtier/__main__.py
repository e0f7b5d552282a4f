"""``python -m kvtier``: the same command line as the ``kvtier`` console script (:mod:`kvtier.cli`),
for a virtual environment whose scripts are not on ``PATH``."""

from kvtier.cli import main

if __name__ == "__main__":
    main()
