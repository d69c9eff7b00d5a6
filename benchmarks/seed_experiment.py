"""The seed note's static-address experiment at driver level (same as ``rawgraph seed``)."""

import sys

from rawgraph.bench.seed import main

if __name__ == "__main__":
    sys.exit(main())
