"""`race train-node --store URL --job DIGEST --machine-rank R`: this host's share of a training stage
whose accelerate config spans several hosts (`num_machines` > 1).

The stage runs on the host of machine rank 0 (the Prefect task: it writes the one checkpoint); it
puts the job (policy, data, settings) into the store and logs the exact command each other host runs.
This command reads the job from the store, fetches the policy and the data to this host, and starts
this host's training processes (`race_core.train.launch`), which meet the others at the config's
`main_process_ip:main_process_port`. Its saved training state stays on this host (under the
checkpoint cache's `train-state/`), so after a failure the rerun of the stage and of this command
resume together.

`add_train_node_parser(subparsers)` adds it to the `race` command.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def add_train_node_parser(subparsers):
    """Add `train-node` to the `race` command's subparsers."""
    p = subparsers.add_parser("train-node", help="join a training stage that spans several hosts, from this host")
    p.add_argument("--store", required=True, help="the artifact store the stage runs on (a URL every host reaches)")
    p.add_argument("--job", required=True, help="the job's digest, as the launching host's log names it")
    p.add_argument("--machine-rank", type=int, required=True, help="this host's rank (1 .. num_machines - 1)")
    p.add_argument("--accelerate-config", default="",
                   help="this host's copy of the accelerate config (default: the launching host's path)")
    p.set_defaults(func=cmd_train_node)
    return p


def cmd_train_node(args) -> int:
    from race_core.train.launch import TrainingFailed
    from storage import ArtifactStore
    from tasks.training_runs import TrainJob, run_job

    if args.machine_rank < 1:
        raise ValueError("--machine-rank: 0 is the launching host's (the stage itself); give 1 or more")
    store = ArtifactStore(args.store)
    job = TrainJob.read(store, args.job)

    logger.info(f"race train-node: {job.kind} job {args.job[:12]} as machine rank {args.machine_rank}")
    try:
        run_job(store, job, machine_rank=args.machine_rank, accelerate_config=args.accelerate_config)
    except TrainingFailed as exc:
        logger.error(f"race train-node: {exc}")
        return 1
    logger.info("race train-node: done")
    return 0
