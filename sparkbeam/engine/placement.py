"""Which stages of a batch plan run in the driver instead of as Spark tasks.

A Spark job costs tens to hundreds of milliseconds before any of its tasks runs. WriteToText's
initialisation and finalisation, like any singleton computed from nothing, are stages that
handle one element, start from an impulse and end in side inputs, which the driver collects
anyway: each would cost a Spark job for a few microseconds of work. Such stages run in the
driver on the values it holds.

The driver stages are the largest set of stages such that each
- is a plain stage (no grouping, state, timers or splitting) on the embedded bundle
  processor (an SDK worker of its own environment runs where Spark runs it);
- reads only impulses and the outputs of other driver stages; and
- feeds no Spark stage: every stage reading one of its outputs as a main input is a driver
  stage too, so nothing a driver stage makes has to travel back into Spark. Its outputs are
  side inputs, inputs of driver stages, or nothing at all; and no Spark stage writes to the
  same buffer (a side input's values are then all in the driver when its readers run).
So a stage that generates data for the rest of the pipeline (an impulse expanded by a
FlatMap into a shuffle) stays a Spark task, and the driver never holds more than Spark would
have collected into it as side inputs, plus what driver stages pass each other.
"""
from __future__ import annotations

from collections.abc import Sequence, Set

from sparkbeam.plan.model import IMPULSE_BUFFER, Stage, StageKind, runs_embedded


def driver_stages(stages: Sequence[Stage], exported: Set[bytes] = frozenset(),
                  kept: Set[str] = frozenset()) -> set[str]:
    """The labels of the stages that run in the driver (see the module doc): the greatest
    set meeting the conditions, found by dropping offenders until none is left. Buffers in
    `exported` are read by Spark outside the stages (a Spark write): their producers stay
    Spark tasks, as do the stages holding a transform named in `kept`."""
    chosen = {s.label for s in stages
              if s.kind is StageKind.PLAIN and s.inputs and runs_embedded(s.environment)
              and not any(o.buffer_id in exported for o in s.outputs)
              and not any(name in kept for name in s.transforms)}
    producers: dict[bytes, set[str]] = {}  # a flattened buffer has several
    readers: dict[bytes, set[str]] = {}
    for s in stages:
        for o in s.outputs:
            producers.setdefault(o.buffer_id, set()).add(s.label)
        for i in s.inputs:
            readers.setdefault(i.buffer_id, set()).add(s.label)
    changed = True
    while changed:
        changed = False
        for s in stages:
            if s.label not in chosen:
                continue
            inputs_here = all(i.buffer_id == IMPULSE_BUFFER
                              or producers.get(i.buffer_id, {""}) <= chosen for i in s.inputs)
            outputs_stay = all(readers.get(o.buffer_id, set()) <= chosen
                               and producers[o.buffer_id] <= chosen for o in s.outputs)
            if not (inputs_here and outputs_stay):
                chosen.discard(s.label)
                changed = True
    return chosen


def shuffled_through(stages: Sequence[Stage], on_driver: Set[str],
                     exported: Set[bytes] = frozenset(),
                     side_inputs: Set[bytes] = frozenset()) -> set[bytes]:
    """The buffers a Spark stage hands only to one other stage: the producer's only output,
    read by nothing else (no other stage, side input or Spark write), and the consumer's only
    input, where the consumer is keyed (the buffer goes into its shuffle) or plain (Spark runs
    the consumer's `mapInArrow` on the producer's in the same tasks: a stateful DoFn's stage
    and the write after it, say). Such a producer is not persisted: its rows, its metric rows
    included, go straight to the consumer, whose tasks read them once and forward the
    producer's metric rows with their own. Persisting it cost a columnar copy of every row in
    the JVM's memory for one reader (a warm stateful job at 20 k events, one session,
    alternating: median 0.828 s persisted, 0.704 s handed through).

    A plain consumer's task that fails and is retried runs its producer's part again (its
    shuffle read, state, timers and any side effects; committed metrics still count once, as
    the retried attempt's): persisting materialised the producer's partition first. So the
    plain case is left out where that would replay more: after a splittable producer (its
    splits), for stages of SDK workers of their own (a task would hold two at once), and for a
    producer whose own input is handed to it that way (one hand-over a task)."""
    producers: dict[bytes, list[Stage]] = {}
    readers: dict[bytes, list[Stage]] = {}
    for s in stages:
        for o in s.outputs:
            producers.setdefault(o.buffer_id, []).append(s)
        for i in s.inputs:
            readers.setdefault(i.buffer_id, []).append(s)
    found = set()
    in_tasks: set[bytes] = set()  # those handed to a plain stage in the producer's tasks
    for buffer, made_by in producers.items():
        read_by = readers.get(buffer, [])
        if len(made_by) != 1 or len(read_by) != 1 or buffer in exported or buffer in side_inputs:
            continue
        producer, consumer = made_by[0], read_by[0]
        if (len(producer.outputs) != 1 or producer.label in on_driver
                or consumer.label in on_driver or len(consumer.inputs) != 1):
            continue
        if consumer.kind.keyed:
            found.add(buffer)
        elif (consumer.kind is StageKind.PLAIN
              and producer.kind not in (StageKind.SPLITTABLE, StageKind.STATEFUL_SPLITTABLE)
              and runs_embedded(producer.environment) and runs_embedded(consumer.environment)):
            in_tasks.add(buffer)
    # One hand-over a task at most: the producer's own input not handed to it in turn.
    producer_of = {b: producers[b][0] for b in in_tasks}
    found |= {b for b in in_tasks
              if not any(i.buffer_id in in_tasks for i in producer_of[b].inputs)}
    return found


def gathered_once(stages: Sequence[Stage], on_driver: Set[str],
                  exported: Set[bytes] = frozenset()) -> set[str]:
    """The Spark stages whose output only the driver reads: no stage reads any of their
    outputs as a main input (a shuffle included), none is a Spark write's, and each has the
    stage as its only producer (no Flatten with another stage's). Their outputs are side
    inputs or nothing (a write's file names, for its finalisation in the driver), so the
    next action reads such a stage once, taking its metric rows and every side input among
    its outputs together. It is not persisted: persisting plans the query an extra time when
    it is declared, and keeps a copy of rows nothing reads again."""
    read = {i.buffer_id for s in stages for i in s.inputs}
    producers: dict[bytes, int] = {}
    for s in stages:
        for o in s.outputs:
            producers[o.buffer_id] = producers.get(o.buffer_id, 0) + 1
    return {s.label for s in stages
            if s.label not in on_driver
            and all(o.buffer_id not in read and o.buffer_id not in exported
                    and producers[o.buffer_id] == 1
                    for o in s.outputs)}
