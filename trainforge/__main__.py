import sys

from trainforge._internal.cli import main

sys.exit(main())
