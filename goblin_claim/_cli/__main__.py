"""``python -m goblin_claim._cli``: the ``goblin-claim`` command."""

import sys

from .main import main

sys.exit(main())
