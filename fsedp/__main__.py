"""``python -m fsedp``: the command-line tool."""

import sys

from fsedp.cli import main

sys.exit(main())
