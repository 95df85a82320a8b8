"""``python -m nearrec.cli``: the ``nearrec`` command."""

import sys

from . import main

sys.exit(main())
