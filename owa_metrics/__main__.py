"""``python -m owa_metrics``: the ``owa-metrics`` command."""

import sys

from .cli import main

sys.exit(main())
