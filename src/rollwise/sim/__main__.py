"""`python -m rollwise.sim`: the `rollwise simulate` command, standalone."""

import sys

from rollwise.sim.command import main

sys.exit(main())
