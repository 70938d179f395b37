"""``python -m shardload``: the same command line as the ``shardload`` script."""

import sys

if __name__ == "__main__":
    try:  # Ctrl-C while the library imports: one line and exit 130, as for the command itself
        from shardload.cli import main
    except KeyboardInterrupt:
        print("shardload: error: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(main())
