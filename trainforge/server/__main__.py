"""``python -m trainforge.server start ...`` = ``trainforge server start ...``."""

import sys

from trainforge._cli import main

sys.exit(main(["server", *sys.argv[1:]]))
