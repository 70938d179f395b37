"""``python -m shardload``: the same command line as the ``shardload`` script."""

import sys

from shardload.cli import main

if __name__ == "__main__":
    sys.exit(main())
