"""`python -m asrdist`: the `asrdist` command."""
import sys

from asrdist.cli import main

sys.exit(main())
