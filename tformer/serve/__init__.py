"""serve: `tformer serve`, an HTTP server (FastAPI + uvicorn) over generate's ContinuousBatcher.

app.create_app builds the app; server.bind / make_server run it; docs/SERVE.md documents the routes,
the errors and the limits. Only tformer.cli imports this package.
"""

from tformer.serve.app import ServeSettings, create_app
from tformer.serve.server import bind, is_loopback, make_server, run

__all__ = ["ServeSettings", "bind", "create_app", "is_loopback", "make_server", "run"]
