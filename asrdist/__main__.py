"""`python -m asrdist`: the `asrdist` command."""
from asrdist.cli import run

run()
