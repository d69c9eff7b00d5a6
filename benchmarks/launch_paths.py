"""Launch-path benchmark entry point (same as ``rawgraph bench``).

PYTHONPATH=. python3 benchmarks/launch_paths.py --quick
PYTHONPATH=. python3 benchmarks/launch_paths.py            # full sweep
"""

import sys

from rawgraph.bench.launch_paths import main

if __name__ == "__main__":
    sys.exit(main())
