"""``python -m flows._cli``: the ``unattended`` command without the console script."""

import sys

from flows._cli import main

sys.exit(main())
