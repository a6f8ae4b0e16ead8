"""The control plane of a job (docs/design.md has the whole picture).

    driver.py        Driver(cfg, stages=...).run(): sets the job up (job_setup.py), then loops:
                     scheduler <-> runtime; progress.py: the progress line
    decisions/       the decisions, pure (no Ray, no torch): events in, commands out
        scheduler.py     routes each event to one of its state machines and keeps the agenda
        events.py, commands.py   what comes in and what goes out
        admission.py     prompts out and groups back: request uids, re-queues, the staleness bound
        versions.py      weight versions: the push in flight, each worker's version
        evaluation.py    held-out parts and protocol units dealt over the workers
        fleet_policy.py  worker starts, losses (replace, drop, give up), resizes, retirements
        fleet.py         the rollout workers' states and the calls out on them
        staleness.py, buffer.py, held_out.py, step_metrics.py, skipped_updates.py, agenda.py
    runtime/         the Ray side: commands -> Ray calls, finished / failed / late calls -> events
        executor.py      the runtime; actor_calls.py: the calls waited for and their deadlines;
                         call_groups.py: calls that end together
        actors.py        starting the actors; pool.py: the rollout workers' processes; placement.py
        weight_sync.py   the driver's end of the weight push
        checkpoint.py    checkpoints on disk, verified before a resume; episode_io.py: buffered groups
        control.py       the job's control actor (`stabledrl scale` talks to it); watchdog.py
"""
