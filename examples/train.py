"""An example training script that survives preemptions and migrations with :mod:`costopt.agent`.

SGD on a synthetic linear-regression problem (numpy, CPU only). Step ``s`` draws its batch from a
generator seeded with ``(seed, s)``, so the weights after ``N`` steps are the same bits however many
times the run was interrupted: resuming from a checkpoint loses nothing and repeats nothing.

    COSTOPT_JOB_ID=demo COSTOPT_CHECKPOINT_URI=/tmp/demo-ckpt COSTOPT_EPOCH=1 \\
        python examples/train.py --steps 200 --checkpoint-every 20

The job contract comes from the environment (``--job-id``, ``--checkpoint-uri``, ``--epoch`` override it
for a run by hand). The script restores the latest checkpoint, reports every completed step to the
agent's progress log (the record to check "exactly the steps asked for, none lost beyond the last
checkpoint, none counted twice"; see :func:`costopt.agent.audit`), checkpoints every
``--checkpoint-every`` steps, at the last step, and whenever the agent says so (a migrator's request,
SIGUSR1, SIGTERM, a preemption notice), and stops once a stop or a notice has been checkpointed.

It prints nothing; it logs to stderr. Exit codes: 0 reached ``--steps``; 75 stopped after a
checkpoint (preempted or terminated: a relaunch resumes); 3 fenced out (a newer copy owns the job);
2 bad configuration.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from costopt.agent import Agent, AgentConfigError, StaleEpoch

EXIT_DONE = 0
EXIT_CONFIG = 2
EXIT_FENCED = 3
EXIT_STOPPED = 75  # EX_TEMPFAIL: try again (from the checkpoint)

log = logging.getLogger("examples.train")


def true_weights(seed: int, dim: int) -> np.ndarray:
    """The weights the regression should find."""
    return np.random.default_rng([seed, 1_000_003]).normal(size=dim)


def batch(seed: int, step: int, dim: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The batch of step ``step`` (1-based): a pure function of ``(seed, step)``."""
    rng = np.random.default_rng([seed, step])
    x = rng.normal(size=(size, dim))
    y = x @ true_weights(seed, dim) + 0.01 * rng.normal(size=size)
    return x, y


def sgd_step(w: np.ndarray, x: np.ndarray, y: np.ndarray, lr: float) -> tuple[np.ndarray, float]:
    residual = x @ w - y
    loss = float(residual @ residual / len(y))
    grad = 2.0 * x.T @ residual / len(y)
    return w - lr * grad, loss


def train(steps: int, *, seed: int = 0, dim: int = 8, batch_size: int = 32, lr: float = 0.05) -> np.ndarray:
    """The uninterrupted reference: the weights after ``steps`` steps from zero."""
    w = np.zeros(dim)
    for s in range(1, steps + 1):
        x, y = batch(seed, s, dim, batch_size)
        w, _ = sgd_step(w, x, y, lr)
    return w


def encode_state(w: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    # JSON floats round-trip exactly (shortest repr), so the restored weights are the same bits.
    return {"w": [float(v) for v in w], "seed": args.seed, "dim": args.dim, "batch_size": args.batch_size}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, required=True, help="total training steps to reach")
    p.add_argument("--checkpoint-every", type=int, default=20, help="checkpoint every K steps (default 20)")
    p.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step, to simulate work")
    p.add_argument(
        "--pace",
        action="store_true",
        help="run at COSTOPT_STEPS_PER_SECOND (the throughput of the GPU the job was given: a fleet's worker "
        "sets it): step k of a run completes k / rate seconds after the run restored; a stop asked for while "
        "a step is under way checkpoints the steps completed and exits without finishing that step",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--notice-policy", choices=("eager", "lazy"), default="eager")
    p.add_argument("--job-id", help="overrides COSTOPT_JOB_ID")
    p.add_argument("--checkpoint-uri", help="overrides COSTOPT_CHECKPOINT_URI")
    p.add_argument("--epoch", type=int, help="overrides COSTOPT_EPOCH")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    if args.steps < 0 or args.checkpoint_every < 1:
        p.error("--steps must be >= 0 and --checkpoint-every >= 1")
    return args


def pace_rate(args: argparse.Namespace) -> float | None:
    """Steps per second to run at with ``--pace`` (None: as fast as the machine goes)."""
    if not args.pace:
        return None
    raw = os.environ.get("COSTOPT_STEPS_PER_SECOND", "")
    try:
        rate = float(raw)
    except ValueError:
        rate = float("nan")
    if not rate > 0 or rate == float("inf"):
        raise SystemExit(f"--pace needs COSTOPT_STEPS_PER_SECOND > 0 in the environment, got {raw!r}")
    return rate


def wait_for_step(agent: Agent, due: float) -> bool:
    """Spend the step's time (until ``due``, monotonic seconds), looking every 20 ms whether the agent
    asks for a checkpoint (a stop, a notice, a request); False when it does before the step is done."""
    while True:
        left = due - time.monotonic()
        if left <= 0:
            return True
        if agent.should_checkpoint():
            return False
        time.sleep(min(left, 0.02))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr, level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    env = dict(os.environ)
    for var, value in (
        ("COSTOPT_JOB_ID", args.job_id),
        ("COSTOPT_CHECKPOINT_URI", args.checkpoint_uri),
        ("COSTOPT_EPOCH", None if args.epoch is None else str(args.epoch)),
    ):
        if value is not None:
            env[var] = value
    try:
        agent = Agent.from_env(env, notice_policy=args.notice_policy)
    except AgentConfigError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG
    try:
        return run(agent, args)
    except StaleEpoch as exc:
        log.warning("fenced out, exiting without writing: %s", exc)
        return EXIT_FENCED
    finally:
        agent.close()


def run(agent: Agent, args: argparse.Namespace) -> int:
    ckpt = agent.restore()
    if ckpt is None:
        step, w = 0, np.zeros(args.dim)
        log.info("job %s epoch %d: starting from scratch", agent.job_id, agent.epoch)
    else:
        state = ckpt.state
        if (state.get("seed"), state.get("dim"), state.get("batch_size")) != (args.seed, args.dim, args.batch_size):
            log.error("checkpoint was made with other settings (%s); refusing to mix runs", state)
            return EXIT_CONFIG
        step, w = ckpt.step, np.asarray(state["w"], dtype=float)
        log.info("job %s epoch %d: resuming after step %d", agent.job_id, agent.epoch, step)

    loss = float("nan")
    rate = pace_rate(args)
    run_start, run_steps = time.monotonic(), 0
    while step < args.steps:
        if rate is not None and not wait_for_step(agent, run_start + (run_steps + 1) / rate):
            # asked to stop (or checkpoint) while the step was under way: it is not done
            agent.checkpoint(step, encode_state(w, args))
            if agent.should_stop():
                log.info("stopping after step %d (checkpointed) for preemption or termination", step)
                return EXIT_FENCED if agent.stale else EXIT_STOPPED
            continue
        run_steps += 1
        x, y = batch(args.seed, step + 1, args.dim, args.batch_size)
        w, loss = sgd_step(w, x, y, args.lr)
        step += 1
        agent.report(step)
        if step % args.checkpoint_every == 0 or step == args.steps or agent.should_checkpoint():
            agent.checkpoint(step, encode_state(w, args))
            log.info("step %d checkpointed (loss %.6g)", step, loss)
        if step < args.steps and agent.should_stop():
            if agent.stale:
                log.warning("a newer copy owns the job; stopping after step %d", step)
                return EXIT_FENCED
            log.info("stopping after step %d (checkpointed) for preemption or termination", step)
            return EXIT_STOPPED
        if args.step_seconds > 0:
            time.sleep(args.step_seconds)
    if ckpt is not None and ckpt.step >= args.steps and step == ckpt.step:
        log.info("already complete at step %d", step)
    agent.finish(step, loss=None if loss != loss else loss)
    log.info("done: %d steps, final loss %.6g", step, loss)
    return EXIT_DONE


if __name__ == "__main__":
    sys.exit(main())
