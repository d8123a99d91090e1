"""``python -m kvnumba`` runs the ``kvnumba`` command."""

import sys

from kvnumba.cli import main

sys.exit(main())
