"""``python -m rawgraph.multi --nproc N script.py args...``: see :mod:`rawgraph.multi.launch`."""

import sys

from .launch import main

sys.exit(main())
