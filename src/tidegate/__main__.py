"""`python -m tidegate` runs the command line."""

from tidegate.cli import app

app()
