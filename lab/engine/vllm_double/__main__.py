"""``python3 -m vllm_double serve MODEL ...``, the same as the ``vllm`` launcher."""

from __future__ import annotations

import sys

from .app import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
