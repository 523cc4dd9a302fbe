"""The process around the steps: console output, devices and threads, distributed ranks,
signals, dry-run planning, optional dependencies. Imports nothing heavy (`python -m
uqcompress` installs the signal handler from here before anything else is imported)."""
