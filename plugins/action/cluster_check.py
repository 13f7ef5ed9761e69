"""sparkserve.deploy.cluster_check on the controller, in the playbook's process (plugin_utils/in_process.py)."""

from __future__ import annotations

from ansible_collections.sparkserve.deploy.plugins.modules.cluster_check import ARGUMENT_SPEC, run
from ansible_collections.sparkserve.deploy.plugins.plugin_utils.in_process import in_process_action

ActionModule = in_process_action(ARGUMENT_SPEC, run)
