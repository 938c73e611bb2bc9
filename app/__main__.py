"""`python -m app …`: the queuelog command without its console script (`python -m app
dispatch --concurrency 8`, as the gunicorn master starts the dispatcher in the container).
Here rather than in app/dispatch/, whose package the command line imports: the entry point
belongs above everything it starts."""

from app.cli import main

main()
