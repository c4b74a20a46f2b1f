"""`tidegate …`: the command line."""
