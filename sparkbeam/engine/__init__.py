"""What batch and streaming share to run a stage's work, without Spark.

- `task.run_stage_task`: one task of a stage over its rows (batch stages, streaming stateless
  stages); `task.TaskSpec` is what travels with the Spark job.
- `program.program_for`: what a stage's descriptor means to the runner, once per process.
- `run.StageRun` / `run.leased_run`: bundles of one stage on one worker, with the timers and
  residual roots they leave (a batch task, or one key's micro-batch in streaming).
- `bundles`: cutting rows into bundles (keyed rows at key boundaries).
- `grouping`: one key's GroupByKey values grouped by window in batch (the default trigger's
  output computed directly, other triggers through Beam's trigger driver).
- `direct`: a plain stage's Map/FlatMap/Filter functions (and lifted combiner) called without
  the bundle processor, handing over to it at the first result or error Beam treats otherwise.
- `timers.TimerBook`: collecting and firing timers in order, within one round limit.
- `watermarks`: watermarks and holds as pure functions over a `HoldStore`.
- `side_inputs`, `arrow`, `context`, `task_errors`, `task_splits`: side-input state, the Arrow
  vehicle of rows, per-process Beam set-up, task failures as the driver sees them, and the task
  side of dynamic rebalancing.

`execute/` (batch on Spark) and `streaming/` (micro-batches on Spark) call these; the engine
calls `control/` (workers) and `plan/` (the plan), never the other way round.
"""
