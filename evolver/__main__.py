"""`python -m evolver` runs the CLI (how `evolver up` starts the daemon in the background)."""

from .cli import main

main()
