"""sparkserve.deploy.recipe_render on the controller, in the playbook's process (plugin_utils/in_process.py)."""

from __future__ import annotations

from ansible_collections.sparkserve.deploy.plugins.modules.recipe_render import ARGUMENT_SPEC, run
from ansible_collections.sparkserve.deploy.plugins.plugin_utils.in_process import in_process_action

ActionModule = in_process_action(ARGUMENT_SPEC, run)
