"""``python -m rawgraph.multi --nproc N script.py args...``: see :mod:`rawgraph.multi.launch`."""

import sys

from .launch import main

if __name__ == "__main__":  # imported (autodoc, a walk over the package's modules): no run, no exit
    sys.exit(main())
