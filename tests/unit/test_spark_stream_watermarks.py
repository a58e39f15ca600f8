"""The watermark of Spark streams read beside the script (`streaming/spark_streams.py`): pure
logic over the files tasks leave and the offsets Spark logs."""
from __future__ import annotations

import os

from sparkbeam.streaming.checkpoint import write_hold
from sparkbeam.streaming.script import MAX_MICROS, MIN_MICROS, Endpoint, Item, Script, offset_for
from sparkbeam.streaming.spark_streams import StreamClock, stream_watermark

S = 1_000_000


def test_processing_time_trails_the_batch_by_a_microsecond(tmp_path) -> None:
    clock = StreamClock("3", str(tmp_path), event_time=False, delay_micros=0)
    assert stream_watermark((clock,), {}, 50 * S) == (50 * S - 1, {})


def test_event_time_trails_the_latest_timestamp_read_by_the_delay(tmp_path) -> None:
    clock = StreamClock("3", str(tmp_path), event_time=True, delay_micros=5 * S)
    assert stream_watermark((clock,), {}, 0) == (MIN_MICROS, {"3": MIN_MICROS})
    write_hold(str(tmp_path), 0, 0, 20 * S)
    write_hold(str(tmp_path), 0, 1, 30 * S)
    wm, seen = stream_watermark((clock,), {}, 0)
    assert (wm, seen) == (25 * S, {"3": 30 * S})
    # An older timestamp read later does not take the watermark back; the offset's record
    # of what was seen carries it even once the files are gone.
    write_hold(str(tmp_path), 1, 0, 10 * S)
    assert stream_watermark((clock,), {"seen": seen}, 0) == (25 * S, {"3": 30 * S})


def test_files_of_batches_well_behind_the_newest_go(tmp_path) -> None:
    clock = StreamClock("3", str(tmp_path), event_time=True, delay_micros=0)
    for batch in range(8):
        write_hold(str(tmp_path), batch, 0, batch * S)
    wm, _ = stream_watermark((clock,), {}, 0)
    assert wm == 7 * S
    assert sorted(os.listdir(tmp_path)) == [f"batch-{b:010d}-part-00000" for b in range(4, 8)]


def test_the_least_stream_bounds_and_the_text_form_round_trips(tmp_path) -> None:
    late = StreamClock("1", str(tmp_path / "a"), event_time=True, delay_micros=0)
    now = StreamClock("2", str(tmp_path / "b"), event_time=False, delay_micros=0)
    write_hold(str(tmp_path / "a"), 0, 0, 7 * S)
    assert stream_watermark((late, now), {}, 9 * S)[0] == 7 * S
    assert StreamClock.from_text(late.as_text()) == late


def test_offsets_with_streams_never_finish_until_drained(tmp_path) -> None:
    """A job of streams alone: the script is empty (its watermark the end of time), the
    streams bound it, and only a drain ends it, with the final watermark."""
    clock = StreamClock("1", str(tmp_path), event_time=True, delay_micros=0)

    def streams(previous: dict, processing: int) -> tuple[int, dict]:
        return stream_watermark((clock,), previous, processing)

    script = Script((), test_clock=False)
    first = offset_for(script, {}, {}, 10 * S, 1, streams=streams)
    assert (first["wm"], first["done"]) == (MIN_MICROS, False)
    write_hold(str(tmp_path), 0, 0, 40 * S)
    second = offset_for(script, {}, first, 11 * S, 2, streams=streams)
    assert (second["wm0"], second["wm"], second["seen"]) == (MIN_MICROS, 40 * S, {"1": 40 * S})
    drained = offset_for(script, {}, second, 12 * S, 3, drained=True, streams=streams)
    assert (drained["wm"], drained["done"]) == (MAX_MICROS, True)


def test_a_script_watermark_behind_the_streams_still_bounds(tmp_path) -> None:
    clock = StreamClock("1", str(tmp_path), event_time=False, delay_micros=0)
    script = Script((Endpoint("e", (Item(watermark=3 * S), Item(watermark=4 * S))),),
                    test_clock=False)
    offset = offset_for(script, {"e": 1}, {}, 10 * S, 1,
                        streams=lambda prev, pt: stream_watermark((clock,), prev, pt))
    assert offset["wm"] == 3 * S
