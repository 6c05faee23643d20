import sys

from rollwise.cli import main

sys.exit(main())
