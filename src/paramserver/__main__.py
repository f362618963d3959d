import sys

from paramserver.cli.main import main

sys.exit(main())
