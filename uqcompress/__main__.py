"""`python -m uqcompress` = `uqc`."""

from uqcompress.cli.app import main

main()
