"""The supervisor of one deployment, run on its head (roles/supervisor/files/sparkserve-supervisor.py is its
entry point and says what it does).

* ``config``: its config file.
* ``render``: the render the launch recorded, its ranks and supervise settings.
* ``nodes``: commands on the nodes (over ssh), the ranks' containers, memory.
* ``probe``: real readiness of the API on the head.
* ``heal_lock``: the deployment's launch lock, taken for a heal.
* ``records``: times, state names, attempts, the metrics' families.
* ``heal``: the Supervisor: one step, and the heal.
* ``program``: arguments, the loop, the exit status.
"""

from __future__ import annotations

from ..api import http_request
from ..docker import parse_started_at
from .config import Config, ConfigError, load_config, parse_config
from .heal import Supervisor
from .probe import probe
from .program import main, run
from .records import STATE_NAMES, compact_time, iso, state_name, supervisor_families
from .render import SUPERVISE_DEFAULTS, Render, RenderError, parse_render, read_render

__all__ = ["STATE_NAMES", "SUPERVISE_DEFAULTS", "Config", "ConfigError", "Render", "RenderError", "Supervisor",
           "compact_time", "http_request", "iso", "load_config", "main", "parse_config",
           "parse_render", "parse_started_at", "probe", "read_render", "run", "state_name", "supervisor_families"]
