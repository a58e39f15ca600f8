"""Stateful DoFns whose output does not depend on the order of a key's elements (which no
runner fixes), for the direct stateful path's differential tests (unit: against the bundle
processor in-process; integration: against FnApiRunner)."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import combiners, userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp


class BagUntilTimer(beam.DoFn):
    """The bench's shape: values buffered in a bag, one event-time timer flushes them."""

    BAG = userstate.BagStateSpec("bag", VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", TimeDomain.WATERMARK)

    def process(self, kv, bag=beam.DoFn.StateParam(BAG),  # type: ignore[no-untyped-def]
                flush=beam.DoFn.TimerParam(FLUSH)):
        bag.add(kv[1])
        flush.set(Timestamp(10**6))

    @userstate.on_timer(FLUSH)
    def on_flush(self, key=beam.DoFn.KeyParam, bag=beam.DoFn.StateParam(BAG),  # type: ignore[no-untyped-def]
                 when=beam.DoFn.TimestampParam):
        yield repr((key, sorted(bag.read()), when.micros))
        bag.clear()


class CountAndAlarm(beam.DoFn):
    """A count per key; a timer 1.5 ms after the key's latest element so far (not whole
    milliseconds), cleared once a key has three; a processing-time timer too. What it outputs
    does not depend on the order of a key's elements, which no runner fixes. (Nor on the order
    between the two time domains' timers: FnApiRunner's is its own.)"""

    COUNT = userstate.ReadModifyWriteStateSpec("count", VarIntCoder())
    LATEST = userstate.ReadModifyWriteStateSpec("latest", VarIntCoder())
    ALARMS = userstate.ReadModifyWriteStateSpec("alarms", VarIntCoder())
    ALARM = userstate.TimerSpec("alarm", TimeDomain.WATERMARK)
    LATER = userstate.TimerSpec("later", TimeDomain.REAL_TIME)

    def process(self, kv, ts=beam.DoFn.TimestampParam,  # type: ignore[no-untyped-def]
                count=beam.DoFn.StateParam(COUNT), latest=beam.DoFn.StateParam(LATEST),
                alarm=beam.DoFn.TimerParam(ALARM), later=beam.DoFn.TimerParam(LATER)):
        n = (count.read() or 0) + 1
        count.write(n)
        last = max(ts.micros, latest.read() if latest.read() is not None else ts.micros)
        latest.write(last)
        if n >= 3:
            alarm.clear()
        else:
            alarm.set(Timestamp(micros=last) + 0.0015)
        later.set(Timestamp(7))
        yield repr(("element", kv[0], ts.micros))

    @userstate.on_timer(ALARM)
    def on_alarm(self, key=beam.DoFn.KeyParam, when=beam.DoFn.TimestampParam,  # type: ignore[no-untyped-def]
                 alarms=beam.DoFn.StateParam(ALARMS)):
        n = (alarms.read() or 0) + 1
        alarms.write(n)
        yield repr(("alarm", key, n, when.micros))

    @userstate.on_timer(LATER)
    def on_later(self, key=beam.DoFn.KeyParam, when=beam.DoFn.TimestampParam,  # type: ignore[no-untyped-def]
                 count=beam.DoFn.StateParam(COUNT)):
        yield repr(("later", key, count.read(), when.micros))


class SumRearmed(beam.DoFn):
    """Combining state; a timer that sets itself again once, one second on, from its callback."""

    TOTAL = userstate.CombiningValueStateSpec("total", combine_fn=sum)
    ROUNDS = userstate.CombiningValueStateSpec("rounds", combine_fn=combiners.CountCombineFn())
    LATEST = userstate.ReadModifyWriteStateSpec("latest", VarIntCoder())
    TICK = userstate.TimerSpec("tick", TimeDomain.WATERMARK)

    def process(self, kv, ts=beam.DoFn.TimestampParam,  # type: ignore[no-untyped-def]
                total=beam.DoFn.StateParam(TOTAL), latest=beam.DoFn.StateParam(LATEST),
                tick=beam.DoFn.TimerParam(TICK)):
        total.add(kv[1])
        last = max(ts.micros, latest.read() if latest.read() is not None else ts.micros)
        latest.write(last)
        tick.set(Timestamp(micros=last))  # the key's latest, whatever the elements' order

    @userstate.on_timer(TICK)
    def on_tick(self, key=beam.DoFn.KeyParam, when=beam.DoFn.TimestampParam,  # type: ignore[no-untyped-def]
                total=beam.DoFn.StateParam(TOTAL), rounds=beam.DoFn.StateParam(ROUNDS),
                tick=beam.DoFn.TimerParam(TICK)):
        rounds.add(1)
        if rounds.read() < 2:
            tick.set(when + 1)
        yield repr((key, total.read(), rounds.read(), when.micros))


DOFNS = {"bag": BagUntilTimer, "count": CountAndAlarm, "sum": SumRearmed}


class FiringOrder(beam.DoFn):
    """Numbers every firing of a key across two time domains, and sets an event-time timer from
    a processing-time one: the order timers fire in shows in its output. FnApiRunner's order
    between time domains is its own, so this one is compared with sparkbeam's bundle processor
    path only (in-process)."""

    SEQ = userstate.ReadModifyWriteStateSpec("seq", VarIntCoder())
    EVENT = userstate.TimerSpec("event", TimeDomain.WATERMARK)
    WALL = userstate.TimerSpec("wall", TimeDomain.REAL_TIME)

    def process(self, kv, ts=beam.DoFn.TimestampParam,  # type: ignore[no-untyped-def]
                event=beam.DoFn.TimerParam(EVENT), wall=beam.DoFn.TimerParam(WALL)):
        event.set(ts, dynamic_timer_tag=str(kv[1] % 3))
        wall.set(Timestamp(micros=kv[1] % 5_000_000))

    def _next(self, seq):  # type: ignore[no-untyped-def]
        n = (seq.read() or 0) + 1
        seq.write(n)
        return n

    @userstate.on_timer(EVENT)
    def on_event(self, key=beam.DoFn.KeyParam, when=beam.DoFn.TimestampParam,  # type: ignore[no-untyped-def]
                 seq=beam.DoFn.StateParam(SEQ)):
        yield repr(("event", key, self._next(seq), when.micros))

    @userstate.on_timer(WALL)
    def on_wall(self, key=beam.DoFn.KeyParam, when=beam.DoFn.TimestampParam,  # type: ignore[no-untyped-def]
                seq=beam.DoFn.StateParam(SEQ), event=beam.DoFn.TimerParam(EVENT)):
        n = self._next(seq)
        if n < 4:
            event.set(when + 0.0005, dynamic_timer_tag="from-wall")
        yield repr(("wall", key, n, when.micros))


class EveryParam(beam.DoFn):
    """`process` asks for every per-element parameter (the key, window, timestamp, pane and
    the whole windowed value), a state shared by the key and a processing-time timer (whose
    hold is the element's timestamp), and outputs what it saw with a running count: the count
    depends on the order of a key's elements, so in-process only."""

    SEEN = userstate.CombiningValueStateSpec("seen", combine_fn=combiners.CountCombineFn())
    LATER = userstate.TimerSpec("later", TimeDomain.REAL_TIME)

    def process(self, kv, key=beam.DoFn.KeyParam, win=beam.DoFn.WindowParam,  # type: ignore[no-untyped-def]
                ts=beam.DoFn.TimestampParam, pane=beam.DoFn.PaneInfoParam,
                wv=beam.DoFn.WindowedValueParam, seen=beam.DoFn.StateParam(SEEN),
                later=beam.DoFn.TimerParam(LATER)):
        seen.add(1)
        later.set(Timestamp(micros=kv[1] % 7_000_000))
        yield repr((key, kv[1], ts.micros, str(win), pane.timing, wv.timestamp.micros,
                    seen.read()))

    @userstate.on_timer(LATER)
    def on_later(self, key=beam.DoFn.KeyParam, when=beam.DoFn.TimestampParam,  # type: ignore[no-untyped-def]
                 seen=beam.DoFn.StateParam(SEEN)):
        yield repr(("later", key, when.micros, seen.read()))


IN_PROCESS_DOFNS = {**DOFNS, "order": FiringOrder, "params": EveryParam}
