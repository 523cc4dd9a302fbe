"""The `uqc` command line: thin Typer commands that map flags to step configs."""
