"""``python -m sparkserve_bench`` (with bench/ on PYTHONPATH)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
