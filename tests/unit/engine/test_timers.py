"""The engine's timers without Spark: a stateful stage run through the embedded bundle
processor, its timers fired by `StageRun.fire_timers` from its `TimerBook`."""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as hs

from sparkbeam.engine import timers as timer_module
from sparkbeam.engine.context import pipeline_context
from sparkbeam.engine.program import program_for
from sparkbeam.engine.run import leased_run
from sparkbeam.engine.timers import ALL, Limits, Ordering, TimerLoopError
from sparkbeam.plan.fuse import plan_pipeline

FIRED: list[tuple[str, int]] = []  # (key, fire time in seconds), in the order they fired
REARM: dict[str, int] = {}  # how many more times a key's timer sets itself again


class Alarm(beam.DoFn):
    """Each element (key, t) sets an event-time timer of its key at t (dynamic tag t, so one
    key holds many); a firing timer re-arms one second later while REARM says so."""

    TIMER = userstate.TimerSpec("alarm", TimeDomain.WATERMARK)

    def process(self, kv, alarm=beam.DoFn.TimerParam(TIMER)):  # type: ignore[no-untyped-def]
        key, at = kv
        alarm.set(Timestamp(at), dynamic_timer_tag=str(at))

    @userstate.on_timer(TIMER)
    def fire(self, key=beam.DoFn.KeyParam, when=beam.DoFn.TimestampParam,  # type: ignore[no-untyped-def]
             alarm=beam.DoFn.TimerParam(TIMER)):
        FIRED.append((key, int(when.micros // 1_000_000)))
        if REARM.get(key, 0) > 0:
            REARM[key] -= 1
            alarm.set(when + 1, dynamic_timer_tag=f"again-{when.micros}")
        return []


def _stage():  # type: ignore[no-untyped-def]
    p = beam.Pipeline()
    _ = (p | beam.Create([("k", 1)]).with_output_types(tuple[str, int])
         | beam.ParDo(Alarm()))
    plan = plan_pipeline(p.to_runner_api())
    stage = next(s for s in plan.stages if s.kind.stateful)
    return plan, stage


PLAN, STAGE = _stage()
PROGRAM = program_for(STAGE, PLAN.components, PLAN.groupings)
ELEMENT = pipeline_context(PLAN.components).coders[STAGE.inputs[0].coder_id].get_impl()


def _elements(pairs: list[tuple[str, int]]) -> dict[int, list[bytes]]:
    return {0: [ELEMENT.encode_nested(WindowedValue((k, t), Timestamp(0), [GlobalWindow()]))
                for k, t in pairs]}


def _run(pairs: list[tuple[str, int]], limits: Limits = ALL) -> None:
    FIRED.clear()
    with leased_run(PROGRAM, bundle_size=3) as run:
        run.run_chunks(_elements(pairs))
        list(run.fire_timers(limits, Ordering.BY_TIME))
        run.worker.state.drop_user_state()


@settings(max_examples=25, deadline=None)
@given(hs.lists(hs.tuples(hs.sampled_from(["a", "b", "c"]), hs.integers(0, 50)),
                min_size=1, max_size=20))
def test_a_keys_timers_fire_in_timestamp_order_and_each_once(pairs) -> None:  # type: ignore[no-untyped-def]
    REARM.clear()
    _run(pairs)
    for key in {k for k, _ in pairs}:
        fired = [t for k, t in FIRED if k == key]
        assert fired == sorted({t for k, t in pairs if k == key})


def test_timers_set_by_timers_fire_and_limits_hold_back_the_rest() -> None:
    REARM.clear()
    REARM.update({"a": 3})
    _run([("a", 10), ("b", 5)])
    assert [t for k, t in FIRED if k == "a"] == [10, 11, 12, 13]
    assert [t for k, t in FIRED if k == "b"] == [5]
    REARM.clear()
    _run([("a", 10), ("a", 30)], Limits(Timestamp(20), Timestamp(20)))
    assert FIRED == [("a", 10)]


def test_a_timer_loop_ends_with_an_error_naming_the_stage(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(timer_module, "MAX_TIMER_ROUNDS", 50)
    REARM.clear()
    REARM.update({"a": 10_000})
    with pytest.raises(TimerLoopError, match=rf"timers of {STAGE.label} \[.*Alarm.*\] kept "
                                             r"re-arming for 50 rounds"):
        _run([("a", 1)])


def test_waiting_says_what_pending_timers_wait_for() -> None:
    REARM.clear()
    FIRED.clear()
    with leased_run(PROGRAM, bundle_size=10) as run:
        run.run_chunks(_elements([("a", 7), ("b", 3)]))
        wait = run.timers.waiting()
        run.worker.state.drop_user_state()
    assert wait is not None
    assert (wait.event, wait.hold) == (3_000_000, 3_000_000)
    assert wait.processing == timer_module.MAX_MICROS
    assert FIRED == []


def test_a_keys_timers_survive_between_runs_in_the_book_it_keeps() -> None:
    """Streaming keeps a key's pending timers between micro-batches: the book handed to a run
    (empty at first) is the one that collects them, and a later run fires them from it."""
    from sparkbeam.engine.timers import TimerBook

    REARM.clear()
    FIRED.clear()
    book = TimerBook(PROGRAM.timer_impls, PROGRAM.timer_domains)
    with leased_run(PROGRAM, bundle_size=10, timers=book) as run:
        run.run_chunks(_elements([("a", 7), ("a", 9)]))
        list(run.fire_timers(Limits(Timestamp(8), Timestamp(8)), Ordering.BY_TIME))
        run.worker.state.drop_user_state()
    assert FIRED == [("a", 7)]
    later = TimerBook(PROGRAM.timer_impls, PROGRAM.timer_domains, book.snapshot())
    with leased_run(PROGRAM, bundle_size=10, timers=later) as run:
        list(run.fire_timers(ALL, Ordering.BY_TIME))
        run.worker.state.drop_user_state()
    assert FIRED == [("a", 7), ("a", 9)]
    assert not later.has_pending()


def _write(key: str, tag: str, at: int | None) -> userstate.Timer:
    """A timer write as Beam's `OutputTimer` makes it: set at `at`, or cleared (None)."""
    stamp = None if at is None else Timestamp(at)
    return userstate.Timer(user_key=key, dynamic_timer_tag=tag, windows=(GlobalWindow(),),
                           clear_bit=at is None, fire_timestamp=stamp, hold_timestamp=stamp,
                           paneinfo=None if at is None else WindowedValue(0, 0, ()).pane_info)


@settings(max_examples=200, deadline=None)
@given(hs.lists(hs.lists(
    # Few distinct writes, so that the same bytes often come twice or more in a row.
    hs.tuples(hs.sampled_from(["a", "b", "ab"]), hs.sampled_from(["", "t"]),
              hs.sampled_from([None, 0, 1, 7])), max_size=12), min_size=1, max_size=3))
def test_collect_keeps_the_last_write_of_each_timer_as_decoding_every_write_does(chunks) -> None:  # type: ignore[no-untyped-def]
    """`collect` skips a write that repeats the one before it undecoded; what it keeps is what
    decoding every write keeps."""
    from apache_beam.coders.coder_impl import create_OutputStream

    from sparkbeam.engine.timers import TimerBook

    (family, impl), = PROGRAM.timer_impls.items()
    encoded = []
    for writes in chunks:
        out = create_OutputStream()
        for write in writes:
            impl.encode_to_stream(_write(*write), out, True)
        encoded.append(out.get())
    expected: dict = {}
    for chunk in encoded:
        for timer in impl.decode_all(chunk):
            ident = (impl._key_coder_impl.encode_nested(timer.user_key),
                     timer.dynamic_timer_tag, timer.windows[0])
            if timer.clear_bit:
                expected.pop(ident, None)
            else:
                expected[ident] = timer
    book = TimerBook(PROGRAM.timer_impls, PROGRAM.timer_domains)
    book.collect({family: encoded})
    assert book.pending.get(family, {}) == expected
