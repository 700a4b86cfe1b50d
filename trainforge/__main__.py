import sys

from trainforge._cli import main

sys.exit(main())
