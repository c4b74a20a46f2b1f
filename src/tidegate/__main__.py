"""`python -m tidegate` runs the command line."""

from tidegate.cli.main import app

app()
