"""Exit codes by cause, and what a run ends with: endpoint, failure, logs, archive."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from cli_streams import failed_run, host_event, model_of, play, stats

from sparkserve.events import replay
from sparkserve.summary import (
    EXIT_BAD_INPUT,
    EXIT_CODES_HELP,
    EXIT_FAILED,
    EXIT_LAUNCH,
    EXIT_OK,
    EXIT_PREFLIGHT,
    EXIT_UNREACHABLE,
    classify,
    curl_command,
    diagnose_lines,
    endpoint_lines,
    failure_lines,
    follow_argv,
    logs_lines,
    monitoring_lines,
    reach_lines,
    summary_json,
)

ARTIFACTS = Path("/srv/sparkserve/artifacts/runs/20261202T100000Z-up")
CURL = ("curl -s http://172.30.77.11:8000/v1/completions -H 'Content-Type: application/json' "
        """-d '{"model": "tiny-model", "prompt": "Hello", "max_tokens": 16}'""")


@pytest.mark.parametrize(("name", "rc", "code"), [
    ("up_success", 0, EXIT_OK),
    ("launch_failed", 2, EXIT_LAUNCH),
    ("unreachable", 4, EXIT_UNREACHABLE),
    ("bad_input", 1, EXIT_BAD_INPUT),
    ("render_ok", 0, EXIT_OK),
    ("render_unknown_recipe", 2, EXIT_BAD_INPUT),
    ("render_bad_inventory", 1, EXIT_BAD_INPUT),
])
def test_exit_code_of_each_recorded_run(name: str, rc: int, code: int) -> None:
    assert classify(model_of(name), rc) == code


@pytest.mark.parametrize(("play_name", "role", "code"), [
    ("Preflight the Sparks", "recipe", EXIT_BAD_INPUT),
    ("Fabric between the Sparks", "recipe", EXIT_BAD_INPUT),
    ("Preflight the Sparks", "preflight", EXIT_PREFLIGHT),
    ("Preflight the Sparks", "", EXIT_PREFLIGHT),
    ("Check the hosts", "preflight", EXIT_PREFLIGHT),
    ("Launch the engine", "fabric", EXIT_LAUNCH),
    ("Launch the engine", "memguard", EXIT_LAUNCH),
    ("Roll back to the previous launch", "engine", EXIT_LAUNCH),
    ("Fabric between the Sparks", "fabric", EXIT_FAILED),
    ("Weights on every Spark", "weights", EXIT_FAILED),
])
def test_exit_code_by_the_failed_task_s_play_and_role(play_name: str, role: str, code: int) -> None:
    assert classify(failed_run(play_name, role), 2) == code


def test_an_unreachable_host_outranks_the_place_it_happened() -> None:
    assert classify(failed_run("Launch the engine", "engine", unreachable=True), 4) == EXIT_UNREACHABLE


def test_a_failure_without_a_failed_task() -> None:
    started = replay([play("Weights on every Spark"),
                      host_event("runner_on_ok", "Weights on every Spark", "spark-1", "Fetch", t=1)])
    assert classify(started, 1) == EXIT_FAILED  # ansible-playbook died mid-run
    stat_only = replay([play("Launch the engine"), stats(2, {"sparkserve_failure": {"stage": "launch"}})])
    assert classify(stat_only, 2) == EXIT_LAUNCH
    assert classify(replay([]), 250) == EXIT_BAD_INPUT


def test_a_run_that_succeeded_is_ok_whatever_it_rescued() -> None:
    model = replay([play("Launch the engine"),
                    host_event("runner_on_failed", "Launch the engine", "spark-1", "Try", role="engine", t=1),
                    stats(2, rescued={"spark-1": 1})])
    assert classify(model, 0) == EXIT_OK


def test_the_help_epilog_documents_every_code() -> None:
    for code, cause in [(0, "success"), (1, "any other failure"), (2, "bad input"), (3, "unreachable"),
                        (4, "preflight refused"), (5, "launch failed"), (130, "interrupted")]:
        assert any(line.split()[0] == str(code) and cause in line for line in EXIT_CODES_HELP.splitlines()[1:]
                   if line.strip() and line.split()[0].isdigit())


def test_the_summary_after_up_names_the_endpoint_what_it_serves_and_how_to_reach_it() -> None:
    lines = endpoint_lines(model_of("up_success"))
    assert lines[0] == "Serving at http://172.30.77.11:8000"
    assert "  model      tiny-model" in lines
    assert "  from       sparkserve-lab/tiny-model @ cb5d5aad86cafef4cd4daec74a0524e8953de95c" in lines
    assert ("  image      sparkserve-lab-registry:5000/sparkserve/engine@sha256:"
            "141cd527a97a160d0f9b585478951382f8351a1f8636711f57b64aba70c988b8") in lines
    assert "  engine     vllm" in lines
    assert "  nodes      spark-1, spark-2" in lines
    assert "  ranks      0 → spark-1, 1 → spark-2" in lines
    stages = lines[lines.index("  stages") + 1:lines.index("Try it:")]
    assert stages == [  # the overlays stage skipped every task: not listed
        "        12s  Preflight the Sparks: ok, nothing changed",
        "        57s  Weights on every Spark: changed on spark-1, spark-2: Fetch the pinned weights once, "
        "and 1 more task",
        "        26s  Launch the engine: changed on spark-1, spark-2: Start the ranks",
    ]
    assert lines[-2:] == ["Try it:", f"  {CURL}"]


def test_a_digest_not_in_the_image_name_gets_its_own_line() -> None:
    model = model_of("up_success")
    model.stats["sparkserve_endpoint"]["image"] = "nvcr.io/nvidia/vllm:25.11"
    assert "  digest     sha256:141cd527a97a160d0f9b585478951382f8351a1f8636711f57b64aba70c988b8" in \
        endpoint_lines(model)


def test_an_api_on_the_head_s_loopback_is_reached_through_an_ssh_tunnel() -> None:
    endpoint = dict(model_of("up_success").stats["sparkserve_endpoint"], loopback=True,
                    url="http://127.0.0.1:8443", api_port=8443)
    assert reach_lines(endpoint) == [
        "The API listens on spark-1's loopback only; open a tunnel from this machine first:",
        "  ssh -N -L 8443:127.0.0.1:8443 root@172.30.77.11",
        "then, in another terminal:",
        "  curl -s http://127.0.0.1:8443/v1/completions -H 'Content-Type: application/json' "
        """-d '{"model": "tiny-model", "prompt": "Hello", "max_tokens": 16}'""",
    ]
    del endpoint["api_port"], endpoint["ssh_user"]
    assert reach_lines(endpoint)[1] == "  ssh -N -L 8443:127.0.0.1:8443 172.30.77.11"


def test_after_a_run_with_the_monitoring_stage_the_summary_says_where_prometheus_is() -> None:
    model = model_of("up_success")
    assert monitoring_lines(model) == []
    model.stats["sparkserve_monitoring"] = {"server": "spark-1", "url": "http://127.0.0.1:9090", "port": 9090,
                                           "loopback": True, "address": "172.30.77.11", "ssh_user": "root",
                                           "targets_up": 4}
    assert endpoint_lines(model)[-2:] == [
        "Prometheus on spark-1 at http://127.0.0.1:9090, 4 targets up",
        "  reach it from this machine: ssh -N -L 9090:127.0.0.1:9090 root@172.30.77.11",
    ]
    model.stats["sparkserve_monitoring"].update(loopback=False, url="http://10.0.0.1:9090")
    assert endpoint_lines(model)[-1] == "Prometheus on spark-1 at http://10.0.0.1:9090, 4 targets up"


def test_the_curl_command_survives_a_shell_whatever_the_model_is_called() -> None:
    command = curl_command("http://h:8000/", "it's \"odd\"")
    words = shlex.split(command)
    assert words[2] == "http://h:8000/v1/completions"
    assert json.loads(words[-1]) == {"model": "it's \"odd\"", "prompt": "Hello", "max_tokens": 16}


def test_a_run_with_no_endpoint_stat_has_no_endpoint_summary() -> None:
    assert endpoint_lines(model_of("render_ok")) == []


def test_a_launch_failure_shows_the_stat_s_node_rank_message_and_log_tail() -> None:
    model = model_of("launch_failed")
    assert failure_lines(model, 2, EXIT_LAUNCH, ARTIFACTS) == [
        'FAILED: stage "launch", node spark-2, rank 1',
        "  deployment lab-tp2 did not come up: rank 1 on spark-2 stopped (exit code 1). The logs show: rank 1 on "
        "spark-2: torch.OutOfMemoryError: CUDA out of memory.",
        "  task: Fail naming the rank and the cause (role engine)",
        "  last log lines of rank 1:",
        "    | INFO loading shard 3/8",
        "    | ERROR torch.OutOfMemoryError: CUDA out of memory.",
        "    | INFO engine process exited",
        "  full logs: /srv/sparkserve/artifacts/lab-tp2/failures/20261202T100031Z",
        f"  run artifacts: {ARTIFACTS}",
        "exit 5: launch failure",
    ]


def test_a_failure_without_a_stat_shows_the_event_s_own() -> None:
    assert failure_lines(model_of("unreachable"), 4, EXIT_UNREACHABLE, ARTIFACTS) == [
        'FAILED: stage "Preflight the Sparks", node spark-2',
        "  Failed to connect to the host via ssh: ssh: connect to host 172.30.77.12 port 22: No route to host",
        "  task: Check this Spark (role preflight)",
        f"  run artifacts: {ARTIFACTS}",
        "exit 3: unreachable host",
    ]


def test_bad_input_before_any_task_shows_ansible_playbook_s_last_lines() -> None:
    lines = failure_lines(model_of("bad_input"), 1, EXIT_BAD_INPUT, ARTIFACTS)
    assert lines[0] == "ansible-playbook stopped (exit 1) before running any task; its last lines:"
    assert lines[1] == ("  [ERROR]: /srv/sparkserve/inventory/lab/cluster.sparks.yml: "
                        "1 problem in the Spark cluster file:")
    assert lines[2].startswith("  inventory: node spark-2: address 172.30.77.11 is also spark-1's")
    assert lines[-1] == "exit 2: bad input"


def test_the_recorded_bad_inventory_run_shows_the_refusal() -> None:
    lines = failure_lines(model_of("render_bad_inventory"), 1, EXIT_BAD_INPUT, ARTIFACTS)
    assert any("fabric MTU 65000 is outside 1280..9216" in line for line in lines)


def test_logs_have_a_header_per_rank_and_the_follow_command_of_the_chosen_rank() -> None:
    model = model_of("logs")
    assert logs_lines(model) == [
        "==> rank 0 · spark-1 · lab-tp2-rank0 <==", "INFO started server", "INFO 200 POST /v1/completions", "",
        "==> rank 1 · spark-2 · lab-tp2-rank1 <==", "INFO worker joined rank 1", "",
    ]
    rank0, rank1 = follow_argv(model, None), follow_argv(model, 1)
    assert rank0 is not None and rank0[-3:] == ["--since", "1s", "lab-tp2-rank0"]
    assert rank1 is not None and rank1[-1] == "lab-tp2-rank1" and "root@172.30.77.12" in rank1
    assert follow_argv(model, 7) is None
    assert logs_lines(model_of("up_success")) == [] and follow_argv(model_of("up_success"), None) is None


def test_diagnose_names_its_archive() -> None:
    model = replay([stats(1, {"sparkserve_diagnose": {"archive": "/srv/sparkserve/artifacts/diagnose/x.tar.gz"}})])
    assert diagnose_lines(model) == ["diagnostic archive: /srv/sparkserve/artifacts/diagnose/x.tar.gz"]
    assert diagnose_lines(replay([stats(1)])) == []


def test_the_json_summary() -> None:
    summary = summary_json(model_of("launch_failed"), "up", 2, EXIT_LAUNCH, ARTIFACTS)
    assert summary["exit_code"] == 5 and summary["cause"] == "launch failure" and summary["rc"] == 2
    assert summary["artifacts"] == str(ARTIFACTS)
    assert [(s["name"], s["state"]) for s in summary["stages"]] == [
        ("Preflight the Sparks", "ok"), ("Launch the engine", "failed")]
    assert summary["failure"]["node"] == "spark-2" and summary["failure"]["rank"] == 1
    assert [f["task"] for f in summary["failures"]] == ["Fail naming the rank and the cause"]
    assert json.loads(json.dumps(summary)) == summary
    ok = summary_json(model_of("up_success"), "up", 0, EXIT_OK, ARTIFACTS)
    assert ok["failure"] is None and ok["stats"]["sparkserve_endpoint"]["model_name"] == "tiny-model"


def test_the_gateway_lines_give_the_url_and_how_to_pass_a_key_never_a_key() -> None:
    from sparkserve.summary import gateway_lines

    keyed = gateway_lines({"url": "http://10.0.0.1:4000", "open": False, "keys": ["alice", "editor"],
                           "models": ["glm", "qwen"], "node": "spark-1", "address": "10.0.0.1", "port": 4000})
    assert keyed[0] == "Gateway: http://10.0.0.1:4000 (OpenAI base URL http://10.0.0.1:4000/v1) for glm, qwen"
    assert "(alice, editor)" in keyed[1] and 'Bearer $SPARKSERVE_API_KEY' in keyed[2]
    assert "http://10.0.0.1:4000/v1/completions" in keyed[2]
    opened = gateway_lines({"url": "http://127.0.0.1:4000", "open": True, "keys": [], "models": ["glm"],
                            "node": "spark-1", "address": "192.168.1.21", "ssh_user": "owner", "port": 4000})
    assert "spark-1's loopback only" in opened[1]
    assert opened[3].strip() == "ssh -N -L 4000:127.0.0.1:4000 owner@192.168.1.21"
