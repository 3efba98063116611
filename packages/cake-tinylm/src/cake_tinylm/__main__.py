"""``python -m cake_tinylm`` -> :func:`cake_tinylm.cli.main`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
