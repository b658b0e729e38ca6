"""`python -m binder.reservation`: the reservation pod program (see program.py)."""

import sys

from binder.reservation.program import main

sys.exit(main())
