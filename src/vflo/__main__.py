"""``python -m vflo`` is the ``vflo`` command."""

import sys

from vflo.cli import main

sys.exit(main())
