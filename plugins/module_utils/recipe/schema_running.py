"""The recipe's sections about a deployment once it is up, as data (schema.py's RECIPE_SPEC takes them as
they are, last): when it counts as serving (readiness), its supervisor (supervise), what each node must have
(host), its qualification benchmark (bench), and where the user finds what the recipe's source does not
publish (supply).

Pure standard library: this file also runs on the nodes.
"""

from __future__ import annotations

from typing import Any, Dict

RUNNING_SECTIONS: Dict[str, Any] = {
    "readiness": {
        "type": "dict",
        "default": {},
        "description": "When the deployment counts as serving.",
        "options": {
            "timeout_s": {
                "type": "int",
                "default": 3600,
                "min": 1,
                "description": "Seconds a boot may take, cold caches included; also vLLM's "
                               "`VLLM_ENGINE_READY_TIMEOUT_S`.",
            },
            "canary_prompt": {
                "type": "str",
                "default": "The capital of France is",
                "description": "Prompt of the one-token completion that proves the engine serves; "
                               "`/v1/models` alone answers while the engine is dead.",
            },
        },
    },
    "supervise": {
        "type": "dict",
        "default": {},
        "description": "The supervisor on the head (role `supervisor`), which heals the deployment once it "
                       "serves: it watches every rank's container, the ranks' logs for the engine's fatal "
                       "patterns and real readiness, and restarts every rank in the recipe's order when one "
                       "fails.",
        "options": {
            "enabled": {
                "type": "bool",
                "default": True,
                "description": "Run the supervisor; false removes it.",
            },
            "interval_s": {
                "type": "int",
                "default": 15,
                "min": 1,
                "description": "Seconds between two checks.",
            },
            "probe_timeout_s": {
                "type": "int",
                "default": 30,
                "min": 1,
                "description": "Timeout of each request of the readiness probe, the one-token completion "
                               "included.",
            },
            "failures_before_heal": {
                "type": "int",
                "default": 3,
                "min": 1,
                "description": "Failed probes in a row (health, models, or a completion that errs or times "
                               "out while health answers: a hang) before the supervisor heals. A rank that "
                               "stopped, or a fatal log line, heals at once.",
            },
            "ready_timeout_s": {
                "type": "int",
                "min": 1,
                "description": "Seconds a restart may take to be ready again; `readiness.timeout_s` when "
                               "unset, as the 15-minute loads of the seeds need.",
            },
            "memory_wait_s": {
                "type": "int",
                "default": 300,
                "min": 0,
                "description": "Seconds to wait, after every rank is stopped, for every node's "
                               "MemAvailable to come back to `memory.min_available_gib`; when it does not, "
                               "the supervisor holds `needs reboot: NODE` with every rank stopped.",
            },
            "backoff_s": {
                "type": "int",
                "default": 30,
                "min": 0,
                "description": "Wait before a second attempt within the hour, doubled at each further one.",
            },
            "backoff_max_s": {
                "type": "int",
                "default": 600,
                "min": 0,
                "description": "The longest wait between two attempts.",
            },
            "max_restarts_per_hour": {
                "type": "int",
                "default": 3,
                "min": 1,
                "description": "Attempts in the last hour after which the supervisor stops trying and "
                               "holds `needs attention: REASON` with every rank stopped, not half up.",
            },
            "start_on_boot": {
                "type": "bool",
                "default": False,
                "description": "Start the supervisor after the head reboots, so that serving comes back "
                               "once every node answers; off by default (seed 003: nothing persists).",
            },
            "log_lines": {
                "type": "int",
                "default": 200,
                "min": 1,
                "description": "Lines of each rank's log saved on the head before a restart.",
            },
        },
    },
    "host": {
        "type": "dict",
        "default": {},
        "description": "What each node must have.",
        "options": {
            "driver_versions": {
                "type": "list",
                "elements": "str",
                "default": ["580."],
                "description": "Allowed NVIDIA driver versions, as prefixes (`580.` allows 580.x; 590.x "
                               "deadlocks in CUDA-graph capture on GB10).",
            },
            "min_free_disk_gib": {
                "type": "number",
                "min": 0,
                "description": "Optional free disk needed where the weights go.",
            },
        },
    },
    "bench": {
        "type": "dict",
        "description": "Optional qualification benchmark (its fields belong to the bench stage).",
        "options": {
            "suites": {
                "type": "list",
                "elements": "raw",
                "default": [],
                "description": "The suites to run.",
            },
            "reference": {
                "type": "raw",
                "description": "Optional reference result the run is compared with.",
            },
            "gates": {
                "type": "dict",
                "values": "raw",
                "default": {},
                "description": "Pass conditions, name to value.",
            },
            "qualify_suite": {
                "type": "str",
                "description": "Optional name of one of `suites`, short enough to run on every upgrade: "
                               "the new release's run of it is compared, under `gates`, with the serving "
                               "release's run of the same suite, and a release that fails is rolled back "
                               "(playbooks/upgrade.yml).",
            },
        },
    },
    "supply": {
        "type": "dict",
        "values": "str",
        "default": {},
        "description": "Where the user finds each value or file the recipe's source does not publish: the name "
                       "of an inventory variable a `*_from` field names, or a file of the recipes folder "
                       "(`overlays[].patch`, `file_overrides[].source`), to one sentence. A deployment "
                       "missing one is refused with every missing one listed, each with its sentence (see "
                       "*Values the user supplies*).",
    },
}
