"""sparkserve: one command over the deployment playbooks, driven through ansible-runner.

The package is installed editable from a checkout and runs that checkout's playbooks; it reads what they
report through the collection's own contract (plugins/module_utils/run_stats.py), imported from the same
checkout: its collections/ folder (where ansible_collections/sparkserve/deploy links to the collection) goes
on the import path here, before any module of the command imports it.
"""

import sys
from pathlib import Path

_COLLECTIONS = str(Path(__file__).resolve().parent.parent / "collections")
if _COLLECTIONS not in sys.path:
    sys.path.append(_COLLECTIONS)
