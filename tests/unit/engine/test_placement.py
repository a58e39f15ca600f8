"""Which stages run in the driver: the WriteToText shape, and every way a stage stays in Spark."""
from __future__ import annotations

import dataclasses

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2

from sparkbeam.engine.placement import driver_stages, gathered_once, shuffled_through
from sparkbeam.plan.model import IMPULSE_BUFFER, Stage, StageInput, StageKind, StageOutput


def _stage(label: str, inputs: list[bytes], outputs: list[bytes],
           kind: StageKind = StageKind.PLAIN, environment: bytes = b"") -> Stage:
    return Stage(
        index=int(label.rsplit("-", 1)[1]), name=label, label=label, description=label,
        transforms=(), descriptor=b"",
        inputs=tuple(StageInput(f"in{n}", b, "c") for n, b in enumerate(inputs)),
        outputs=tuple(StageOutput(f"out{n}", b, "c") for n, b in enumerate(outputs)),
        kind=kind, environment=environment,
    )


def _write_to_text(data_kind: StageKind = StageKind.GROUPED) -> list[Stage]:
    """The stages of `Create(...) | WriteToText(...)` as the fuser makes them."""
    return [
        _stage("stage-000", [IMPULSE_BUFFER], [b"created"]),  # Create, into a reshuffle
        _stage("stage-001", [IMPULSE_BUFFER], [b"do_once", b"init"]),  # DoOnce, Initialize
        _stage("stage-002", [b"created"], [b"written"], data_kind),  # WriteBundles (init side)
        _stage("stage-003", [b"written"], [b"results"], StageKind.GROUPED),  # Extract
        _stage("stage-004", [b"do_once"], [b"pre"]),  # PreFinalize (init, results sides)
        _stage("stage-005", [b"do_once"], []),  # FinalizeWrite (init, results, pre sides)
    ]


def test_write_to_text_initialisation_and_finalisation_run_in_the_driver() -> None:
    assert driver_stages(_write_to_text()) == {"stage-001", "stage-004", "stage-005"}


def test_a_stage_feeding_a_spark_stage_stays_in_spark_and_so_do_its_driver_readers() -> None:
    stages = _write_to_text()
    # A PLAIN reader of do_once that feeds the shuffle: do_once must travel into Spark, so
    # DoOnce's stage stays there, and then its other readers cannot run in the driver.
    stages.append(_stage("stage-006", [b"do_once"], [b"created"]))
    assert driver_stages(stages) == set()


def test_data_generated_from_an_impulse_for_the_pipeline_stays_in_spark() -> None:
    # Impulse | FlatMap(generate) | GroupByKey: the generator's output is a main input of a
    # grouped stage.
    stages = [_stage("stage-000", [IMPULSE_BUFFER], [b"generated"]),
              _stage("stage-001", [b"generated"], [], StageKind.GROUPED)]
    assert driver_stages(stages) == set()


def test_a_buffer_a_spark_stage_also_writes_keeps_its_driver_producer_in_spark() -> None:
    # A side input flattened from a driver candidate and a Spark stage: all of its values
    # must come from Spark's collection, so neither producer runs in the driver.
    stages = [_stage("stage-000", [IMPULSE_BUFFER], [b"side"]),
              _stage("stage-001", [IMPULSE_BUFFER], [b"data"]),
              _stage("stage-002", [b"data"], [b"side"], StageKind.GROUPED)]
    assert driver_stages(stages) == set()


def test_keyed_stages_and_sdk_worker_environments_stay_in_spark() -> None:
    process = beam_runner_api_pb2.Environment(
        urn=common_urns.environments.PROCESS.urn).SerializeToString()
    stages = [_stage("stage-000", [IMPULSE_BUFFER], [b"a"], StageKind.STATEFUL),
              _stage("stage-001", [IMPULSE_BUFFER], [b"b"], StageKind.SPLITTABLE),
              _stage("stage-002", [IMPULSE_BUFFER], [b"c"], environment=process),
              _stage("stage-003", [IMPULSE_BUFFER], [b"d"])]
    assert driver_stages(stages) == {"stage-003"}


def test_a_stage_without_inputs_is_not_a_driver_stage() -> None:
    assert driver_stages([_stage("stage-000", [], [b"x"])]) == set()


def test_only_a_sole_output_read_by_one_stage_alone_goes_straight_to_it() -> None:
    stages = [
        _stage("stage-000", [b"lines"], [b"pairs"]),  # read, parse: into the GroupByKey
        _stage("stage-001", [b"pairs"], [b"grouped"], StageKind.GROUPED),  # group, format
        _stage("stage-002", [b"grouped"], [b"counted"], StageKind.STATEFUL),  # another key
        _stage("stage-003", [b"counted"], [b"two", b"outs"]),  # two outputs
        _stage("stage-004", [b"two"], [], StageKind.GROUPED),
        _stage("stage-005", [b"outs"], [b"side"], StageKind.GROUPED),
        _stage("stage-006", [b"side"], [b"cogrouped"]),
        _stage("stage-007", [b"cogrouped", b"other"], [], StageKind.GROUPED),  # two inputs
        _stage("stage-008", [b"lines"], [b"other"]),
        _stage("stage-009", [b"lines"], [b"plain"]),
        _stage("stage-010", [b"plain"], []),  # a plain reader: in the producer's tasks
        _stage("stage-011", [b"lines"], [b"restrictions"], StageKind.SPLITTABLE),
        _stage("stage-012", [b"restrictions"], []),  # a splittable producer keeps its tasks
    ]
    # Into a shuffle (pairs, grouped), or to a plain stage in the same tasks (counted, from a
    # stateful stage; side, from a grouped one; plain).
    every = {b"pairs", b"grouped", b"counted", b"side", b"plain"}
    assert shuffled_through(stages, set()) == every
    # Read as a side input too, written by WriteToSpark, or produced or read in the driver:
    # persisted, as before.
    assert shuffled_through(stages, set(), side_inputs={b"pairs"}) == every - {b"pairs"}
    assert shuffled_through(stages, set(), exported={b"grouped"}) == every - {b"grouped"}
    assert shuffled_through(stages, {"stage-000"}) == every - {b"pairs"}
    assert shuffled_through(stages, {"stage-002"}) == every - {b"grouped", b"counted"}
    assert shuffled_through(stages, {"stage-010"}) == every - {b"plain"}
    # Two producers (a flattened buffer), or two readers.
    flattened = [*stages, _stage("stage-013", [b"lines"], [b"pairs"])]
    assert shuffled_through(flattened, set()) == every - {b"pairs"}
    twice = [*stages, _stage("stage-014", [b"pairs"], [], StageKind.GROUPED)]
    assert shuffled_through(twice, set()) == every - {b"pairs"}


def test_a_plain_stage_runs_in_its_producers_tasks_once_a_task_and_only_embedded() -> None:
    chain = [
        _stage("stage-000", [b"lines"], [b"a"], StageKind.STATEFUL),
        _stage("stage-001", [b"a"], [b"b"]),  # in stage-000's tasks
        _stage("stage-002", [b"b"], [b"c"]),  # not in them too: one hand-over a task
        _stage("stage-003", [b"c"], [], StageKind.GROUPED),  # a shuffle: always
    ]
    assert shuffled_through(chain, set()) == {b"a", b"c"}
    process = beam_runner_api_pb2.Environment(
        urn=common_urns.environments.PROCESS.urn).SerializeToString()
    own = [dataclasses.replace(chain[0], environment=process), *chain[1:]]
    assert shuffled_through(own, set()) == {b"b", b"c"}


def test_a_write_whose_names_skip_the_regroup_keeps_its_writing_stage_in_spark() -> None:
    """`Create(reshuffle=False) | WriteToText` once its names go straight to finalising
    (`plan/write_results.py`): the writing stage reads the impulse and feeds only side inputs,
    yet stays a Spark task, as it was while it fed the regroup's shuffle."""
    writing = dataclasses.replace(_stage("stage-000", [IMPULSE_BUFFER], [b"written"]),
                                  transforms=("Create/Map(decode)", "Out/WriteBundles"))
    stages = [writing,
              _stage("stage-001", [IMPULSE_BUFFER], [b"do_once", b"init"]),
              _stage("stage-002", [b"do_once"], [b"pre"]),
              _stage("stage-003", [b"do_once"], [])]
    assert driver_stages(stages) == {"stage-000", "stage-001", "stage-002", "stage-003"}
    assert driver_stages(stages, kept={"Out/WriteBundles"}) == {
        "stage-001", "stage-002", "stage-003"}


def test_a_spark_stage_only_the_driver_reads_is_gathered_once() -> None:
    stages = [
        _stage("stage-000", [b"lines"], [b"pairs"]),  # read by a Spark stage: persisted
        _stage("stage-001", [b"pairs"], [b"names", b"unread"], StageKind.GROUPED),
        _stage("stage-002", [IMPULSE_BUFFER], [b"done"]),  # a finalisation, in the driver
        _stage("stage-003", [b"lines"], []),  # a sink
        _stage("stage-004", [b"lines"], [b"flat"]),
        _stage("stage-005", [b"lines"], [b"flat"]),  # two producers of one buffer
    ]
    on_driver = {"stage-002"}
    assert gathered_once(stages, on_driver) == {"stage-001", "stage-003"}
    # A Spark write reads one of its outputs; a stage of the driver is not a Spark stage.
    assert gathered_once(stages, on_driver, exported={b"unread"}) == {"stage-003"}
    assert gathered_once(stages, {"stage-001", "stage-002"}) == {"stage-003"}
    # Over Spark Connect nothing runs in the driver: the finalisation reads the names as its
    # main input, so their stage is persisted.
    finalise = [*stages, _stage("stage-006", [b"names"], [])]
    assert gathered_once(finalise, set()) == {"stage-002", "stage-003", "stage-006"}
