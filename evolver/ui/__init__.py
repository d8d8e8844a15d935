"""The live dashboard, `evolver ui`: a web page on loopback that shows the running daemon.

It reaches the daemon only through the daemon's socket API, as the CLI does
(it never opens the store: the daemon owns it), so what it shows is what
`evolver status`, `tasks`, `tree`, `insights`, `tools` and `history` show.

Imports: ``evolver.tree.export`` (the tree's HTML page) and nothing of the
service or the API; ``evolver.cli`` imports it.
"""

from .app import create_ui_app
from .serve import serve_ui

__all__ = ["create_ui_app", "serve_ui"]
