"""The end of a run says what happened: only the stages that did something, with what they changed, and a
failure's first cause without its echoes (events.py and summary.py say the rules)."""

from __future__ import annotations

from pathlib import Path

from cli_streams import host_event, model_of, play, stats

from sparkserve.events import replay
from sparkserve.summary import EXIT_UNREACHABLE, classify, failure_lines, stage_lines, summary_json

ARTIFACTS = Path("/srv/sparkserve/artifacts/runs/x")


def test_the_recorded_up_lists_each_stage_with_what_it_changed() -> None:
    assert stage_lines(model_of("lab_up")) == [
        "         2s  Preflight the Sparks: ok, nothing changed",
        "         3s  Peer ssh between the Sparks, and node protection: ok, nothing changed",
        "         4s  The recipe's image on every Spark: changed on spark-1, spark-2: Pull the recipe's image by "
        "digest where it is not there yet",
        "         4s  Fabric between the Sparks: ok, nothing changed",
        "        18s  Weights on every Spark: changed on spark-2: Make the folder of the revision on every other node "
        "- sparkserve-lab/tiny-model, and 3 more tasks",
        "         2s  Overlays on the pinned image: changed on spark-1, spark-2: Extract, check, patch at zero fuzz "
        "and check each overlay file",
        "        23s  Launch the engine: changed on spark-1, spark-2: Install the flusher program, its unit and this "
        "deployment's settings, and 9 more tasks",
    ]


def test_the_recorded_failed_up_leaves_out_the_stage_that_only_validated_its_arguments() -> None:
    model = model_of("lab_up_failed")
    assert stage_lines(model) == [
        "         4s  Preflight the Sparks: ok, nothing changed",
        "         5s  Peer ssh between the Sparks, and node protection: ok, nothing changed",
        "         2s  The recipe's image on every Spark: ok, nothing changed",
        "         5s  Fabric between the Sparks: ok, nothing changed",
        "         4s  Weights on every Spark: ok, nothing changed",
        "      1m03s  Launch the engine: failed on spark-1",
    ]
    overlays = next(s for s in model.stages if s.name == "Overlays on the pinned image")
    assert (overlays.state, overlays.did_something) == ("ok", False)  # it validated its arguments, no more
    assert [s["did_something"] for s in summary_json(model, "up", 2, 5, ARTIFACTS)["stages"]] == [
        True, True, True, True, True, False, True]
    assert not any("more failed task" in line for line in failure_lines(model, 2, 5, ARTIFACTS))


def _context(name: str, t: float) -> list[dict[str, object]]:
    """A play that only reads its context: argument validation, the recipe role, a fact, a skipped include."""
    return [play(name, t),
            host_event("runner_on_ok", name, "spark-1", "Validating arguments against arg spec 'main'", t=t,
                       role="release", action="ansible.builtin.validate_argument_spec"),
            host_event("runner_on_ok", name, "spark-1", "Check the recipe exists", role="recipe", t=t,
                       action="ansible.builtin.assert"),
            host_event("runner_on_ok", name, "spark-1", "Note what failed", role="release", t=t,
                       action="ansible.builtin.set_fact"),
            host_event("runner_on_skipped", name, "spark-1", "Launch the serving release again", role="release",
                       t=t, action="ansible.builtin.include_role")]


def test_stages_that_skipped_everything_or_only_read_their_context_are_not_listed() -> None:
    model = replay([
        play("Preflight the Sparks", 0),
        host_event("runner_on_skipped", "Preflight the Sparks", "spark-1", "Check this Spark", role="preflight"),
        *_context("Read the recipe and what serves", 1),
        play("The recipe's image on every Spark", 2),
        host_event("runner_on_ok", "The recipe's image on every Spark", "spark-1", "Pull the image", role="image",
                   t=3, res={"changed": True}),
        host_event("runner_on_ok", "The recipe's image on every Spark", "spark-2", "Pull the image", role="image",
                   t=4, res={"changed": False}),
        *_context("Read the recipe and what serves", 5),
        *_context("Roll back to the serving release when the new one failed", 6),
        play("Supervise the deployment", 7),
        host_event("runner_on_ok", "Supervise the deployment", "spark-1", "Check the supervisor runs",
                   role="supervisor", t=9, action="ansible.builtin.command"),
        stats(10),
    ])
    assert stage_lines(model) == [
        "         3s  The recipe's image on every Spark: changed on spark-1: Pull the image",
        "         3s  Supervise the deployment: ok, nothing changed",
    ]


def test_a_node_down_shows_the_first_cause_and_not_its_echoes() -> None:
    """spark-2 is lost; a later play fails on spark-1 on the fact spark-2 never set, and again on spark-2."""
    model = replay([
        play("Preflight the Sparks", 0),
        host_event("runner_on_ok", "Preflight the Sparks", "spark-1", "Check this Spark", role="preflight", t=1),
        host_event("runner_on_unreachable", "Preflight the Sparks", "spark-2", "Check this Spark", role="preflight",
                   t=1, res={"msg": "Failed to connect to the host via ssh: No route to host", "unreachable": True}),
        play("Launch the engine", 2),
        host_event("runner_on_failed", "Launch the engine", "spark-1", "Decide what to start", role="engine", t=3,
                   res={"msg": "The task includes an option with an undefined variable. "
                               "'release_serving' is undefined"}),
        host_event("runner_on_failed", "Launch the engine", "spark-2", "Stop the ranks", role="engine", t=4,
                   res={"msg": "unreachable again"}),
        stats(5, failures={"spark-1": 1, "spark-2": 1}, dark={"spark-2": 1}),
    ])
    assert classify(model, 4) == EXIT_UNREACHABLE
    assert failure_lines(model, 4, EXIT_UNREACHABLE, ARTIFACTS) == [
        'FAILED: stage "Preflight the Sparks", node spark-2',
        "  Failed to connect to the host via ssh: No route to host",
        "  task: Check this Spark (role preflight)",
        f"  run artifacts: {ARTIFACTS}",
        "exit 3: unreachable host",
    ]
    assert stage_lines(model) == [
        "         2s  Preflight the Sparks: failed on spark-2",
        "         3s  Launch the engine: failed on spark-1, spark-2, after the first failure",
    ]


def test_independent_failures_are_counted() -> None:
    model = replay([
        play("Weights on every Spark", 0),
        host_event("runner_on_failed", "Weights on every Spark", "spark-1", "Fetch", role="weights", t=1,
                   res={"msg": "disk full"}),
        host_event("runner_on_failed", "Weights on every Spark", "spark-2", "Fetch", role="weights", t=2,
                   res={"msg": "checksum mismatch"}),
        stats(3, failures={"spark-1": 1, "spark-2": 1}),
    ])
    lines = failure_lines(model, 2, 1, ARTIFACTS)
    assert lines[:2] == ['FAILED: stage "Weights on every Spark", node spark-1', "  disk full"]
    assert "  1 more failed task (in the run's events)" in lines
