import sys

from paramserver.cli import main

sys.exit(main())
