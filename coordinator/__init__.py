"""The control plane of a job (docs/design.md has the whole picture).

    driver.py       Driver(cfg, stages=...).run(): sets the job up, then loops: scheduler <-> runtime
    scheduler.py    the decisions, pure: events in (events.py), commands out (commands.py); it routes
                    each event to one of its state machines and keeps the agenda; no Ray, no torch
    admission.py    prompts out and groups back: request uids, re-queues, the staleness bound, buffer
    weights.py      weight versions: the push in flight, each worker's version, what a new one loads
    evaluation.py   held-out parts and protocol units dealt over the workers
    fleet_policy.py worker starts, losses (replace, drop, give up), resizes, retirements
    fleet.py        the rollout workers' states and the calls out on them (pure)
    staleness.py    the admission bound and the drop rule (pure); buffer.py: finished groups
    held_out.py     the job's held-out evaluation: parts, re-runs, the merge (pure)
    step_metrics.py what a step's metrics line holds (pure)
    runtime.py      commands -> Ray calls, finished / failed / late calls -> events; actor_calls.py:
                    the calls waited for and their deadlines; call_groups.py: calls that end together
    actors.py       starting the actors; pool.py: the rollout workers' processes; placement.py
    weight_sync.py  the driver's end of the weight push
    checkpoint.py   checkpoints on disk, verified before a resume; episode_io.py: buffered groups
    control.py      the job's control actor (`stabledrl scale` talks to it)
"""
