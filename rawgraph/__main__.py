"""``python -m rawgraph``: the ``rawgraph`` command (:func:`rawgraph.cli.main`)."""

import sys

from .cli import main

if __name__ == "__main__":  # imported (autodoc, a walk over the package's modules): no run, no exit
    sys.exit(main())
