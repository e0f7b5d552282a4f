"""``python -m tools``: the development tools' command line (:mod:`tools.cli`)."""

from tools.cli import main

main()
