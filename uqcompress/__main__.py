"""`python -m uqcompress` = `uqc`."""

import sys

from uqcompress.runtime import interrupts


def main() -> None:
    """`uqc` with signals recorded before anything heavy (Typer, the commands) is imported."""
    interrupts.install()
    try:
        from uqcompress.cli.app import main as cli_main
    except BaseException:
        # Interrupted mid-import: the KeyboardInterrupt, or what it left half-imported.
        if not interrupts.interrupted():
            raise
        interrupts.settle()
        sys.stderr.write("error: interrupted; no artifact was written\n")
        sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()
