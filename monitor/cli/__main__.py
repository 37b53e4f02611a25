"""`python -m decodemon.monitor.cli`: the `decodemon` command."""

import sys

from decodemon.monitor.cli import main

sys.exit(main())
