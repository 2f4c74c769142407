"""The agent a training loop talks to: restore, report progress, checkpoint (atomic and fenced),
and know when to checkpoint (a request, a signal, a preemption notice) and when to stop.

A loop looks like::

    agent = Agent.from_env()
    ckpt = agent.restore()
    step, state = (ckpt.step, ckpt.state) if ckpt else (0, fresh_state())
    while step < total:
        state = train_one_step(state)
        step += 1
        agent.report(step)
        if step % every == 0 or step == total or agent.should_checkpoint():
            agent.checkpoint(step, state)
        if agent.should_stop():
            sys.exit(75)          # checkpointed (or fenced out): a new copy resumes from here
    agent.finish(step)

Fencing: the job's epoch (``COSTOPT_EPOCH``) is claimed at the checkpoint location when the agent
starts (``epoch.json`` is raised to it; the migrator raises it before launching a new copy). A
checkpoint is refused with :class:`StaleEpoch` (nothing written) when the marker or the latest
checkpoint carries a newer epoch, and the marker is read again after publishing: a write that lost
the race to a newer claim is withdrawn. The latest checkpoint is the one with the greatest
``(epoch, step)``, so even a write that slipped through can never shadow a newer copy's.

Clock: every deadline is computed from the injected ``clock`` (``time.time`` by default).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any, Literal

from costopt.agent.contract import (
    ENV_CHECKPOINT_MARGIN,
    ENV_CHECKPOINT_URI,
    ENV_EPOCH,
    ENV_JOB_ID,
)
from costopt.agent.errors import AgentConfigError, CheckpointError, ForeignCheckpoint, StaleEpoch
from costopt.agent.layout import (
    CHECKPOINT_DIR,
    MAX_SERVED_IDS,
    Checkpoint,
    CheckpointRef,
    Manifest,
    checkpoint_name,
    delete_checkpoint,
    encode_checkpoint,
    encode_state,
    latest_checkpoint,
    list_checkpoints,
    manifest_name,
    payload_digest,
    progress_name,
    read_epoch_marker,
    read_manifest,
    read_request,
    temp_epoch,
    write_epoch_marker,
    write_manifest,
)
from costopt.agent.notices import CHECKPOINT_MARGIN_SECONDS, Clock, Notice, NoticeSource, sources_from_env
from costopt.agent.progress import record_line
from costopt.agent.storage import LocalStorage, Storage, open_storage

log = logging.getLogger("costopt.agent")

NoticePolicy = Literal["eager", "lazy"]


class Agent:
    """One copy of a training job's handle on its checkpoint location.

    Parameters (beyond the contract ``job_id``, ``checkpoint_uri``, ``epoch``):

    - ``storage``: overrides the storage opened from ``checkpoint_uri`` (tests, custom options);
    - ``clock``: wall-clock seconds (``time.time``); every deadline and throttle uses it;
    - ``notice_sources``: where preemption notices come from (:mod:`costopt.agent.notices`);
    - ``margin``: finish a checkpoint this many seconds before a notice's deadline (5 s);
    - ``notice_policy``: ``"eager"`` checkpoints as soon as a notice arrives; ``"lazy"`` keeps training
      until the time left is down to the checkpoint budget (twice the last checkpoint's duration, at
      least ``lazy_min_budget``, plus two steps), e.g. to use most of AWS's two minutes;
    - ``keep``: how many checkpoints to keep (older ones of this job are deleted after a write);
    - ``poll_interval``: seconds between reads of the request file and polls of notice sources
      (signals force an immediate poll); ``stale_check_interval``: between reads of the epoch marker;
    - ``progress_flush_interval``: progress is appended at once on local storage; on object stores it
      is buffered and written as a chunk at most this often (and at every checkpoint and at the end);
    - ``on_progress``: called with every progress record (in addition to the log, or instead of it
      with ``write_progress=False``).
    """

    def __init__(
        self,
        job_id: str,
        checkpoint_uri: str,
        epoch: int,
        *,
        storage: Storage | None = None,
        clock: Clock = time.time,
        notice_sources: Sequence[NoticeSource] = (),
        margin: float = CHECKPOINT_MARGIN_SECONDS,
        notice_policy: NoticePolicy = "eager",
        lazy_min_budget: float = 10.0,
        keep: int = 2,
        poll_interval: float | None = None,
        stale_check_interval: float = 5.0,
        progress_flush_interval: float = 10.0,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        write_progress: bool = True,
    ) -> None:
        if not job_id:
            raise AgentConfigError("job id must not be empty")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
            raise AgentConfigError(f"the fencing epoch must be an integer >= 1, got {epoch!r}")
        if keep < 1:
            raise AgentConfigError("keep must be at least 1 (the latest checkpoint)")
        if notice_policy not in ("eager", "lazy"):
            raise AgentConfigError(f"notice_policy must be 'eager' or 'lazy', got {notice_policy!r}")
        self.job_id = job_id
        self.uri = checkpoint_uri
        self.epoch = epoch
        self.storage: Storage = storage if storage is not None else open_storage(checkpoint_uri)
        self.clock = clock
        self.notice_sources = list(notice_sources)
        self.margin = float(margin)
        self.notice_policy: NoticePolicy = notice_policy
        self.lazy_min_budget = float(lazy_min_budget)
        self.keep = keep
        local = isinstance(self.storage, LocalStorage)
        self.poll_interval = float(poll_interval if poll_interval is not None else (1.0 if local else 5.0))
        self.stale_check_interval = float(stale_check_interval)
        self.progress_flush_interval = 0.0 if local else float(progress_flush_interval)
        self.on_progress = on_progress
        self.write_progress = write_progress
        self.run_id = secrets.token_hex(6)

        self._started = False
        self._restore_done = False
        self._restored: Checkpoint | None = None
        self._floor = 0
        self._last_written: CheckpointRef | None = None
        self._stale = False
        self._served: dict[str, None] = {}  # request ids answered (by this run or its lineage), oldest first
        self._pending_request: dict[str, Any] | None = None
        self._notice: Notice | None = None
        self._notice_checkpointed = False
        self._checkpoint_signal = False
        self._stop_signal = False
        self._stop_checkpointed = False
        self._force_poll = False
        self._next_request_poll = -math.inf
        self._next_stale_check = -math.inf
        self._source_next: dict[int, float] = {}
        self._source_failures: dict[int, int] = {}
        self._last_report_at: float | None = None
        self._step_seconds: float | None = None
        self._checkpoint_seconds: float | None = None
        self._buffer: list[str] = []
        self._last_flush = -math.inf
        self._saved_handlers: dict[int, Any] = {}

    # -- construction ------------------------------------------------------------------------------

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        install_signals: bool = True,
        **kwargs: Any,
    ) -> Agent:
        """The agent of the job this process is: ``COSTOPT_JOB_ID``, ``COSTOPT_CHECKPOINT_URI``,
        ``COSTOPT_EPOCH`` (required), notice sources from ``COSTOPT_NOTICE_FILE`` /
        ``COSTOPT_NOTICE_SOURCE``, the margin from ``COSTOPT_CHECKPOINT_MARGIN``. With
        ``install_signals`` (and on the main thread), SIGUSR1 requests a checkpoint and SIGTERM a
        checkpoint then a stop."""
        env = os.environ if environ is None else environ
        missing = [v for v in (ENV_JOB_ID, ENV_CHECKPOINT_URI, ENV_EPOCH) if not env.get(v, "").strip()]
        if missing:
            raise AgentConfigError(f"the job's environment lacks {', '.join(missing)}: the launcher must set them")
        try:
            epoch = int(env[ENV_EPOCH].strip())
        except ValueError as exc:
            raise AgentConfigError(f"{ENV_EPOCH}={env[ENV_EPOCH]!r} is not an integer") from exc
        if "margin" not in kwargs and env.get(ENV_CHECKPOINT_MARGIN, "").strip():
            try:
                kwargs["margin"] = float(env[ENV_CHECKPOINT_MARGIN])
            except ValueError as exc:
                raise AgentConfigError(
                    f"{ENV_CHECKPOINT_MARGIN}={env[ENV_CHECKPOINT_MARGIN]!r} is not a number"
                ) from exc
        kwargs.setdefault("notice_sources", sources_from_env(env))
        agent = cls(env[ENV_JOB_ID].strip(), env[ENV_CHECKPOINT_URI].strip(), epoch, **kwargs)
        if install_signals:
            agent.install_signal_handlers()
        return agent

    # -- signals -----------------------------------------------------------------------------------

    def install_signal_handlers(
        self,
        checkpoint_signals: Sequence[int] = (signal.SIGUSR1,),
        stop_signals: Sequence[int] = (signal.SIGTERM,),
    ) -> bool:
        """Route signals to the agent: ``checkpoint_signals`` request a checkpoint (and an immediate
        look for a notice file); ``stop_signals`` request a checkpoint and then a stop. Returns False
        (and installs nothing) off the main thread. :meth:`close` puts the previous handlers back."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("signal handlers can only be installed from the main thread; relying on polling")
            return False
        for sig in checkpoint_signals:
            self._saved_handlers.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, self._on_checkpoint_signal)
        for sig in stop_signals:
            self._saved_handlers.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, self._on_stop_signal)
        return True

    def _on_checkpoint_signal(self, signum: int, frame: FrameType | None) -> None:
        self._checkpoint_signal = True
        self._force_poll = True

    def _on_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop_signal = True
        self._force_poll = True

    def request_checkpoint(self) -> None:
        """Ask for a checkpoint from inside the process (what SIGUSR1 does)."""
        self._checkpoint_signal = True

    def request_stop(self) -> None:
        """Ask for a checkpoint then a stop from inside the process (what SIGTERM does)."""
        self._stop_signal = True

    def restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._saved_handlers.items():
            signal.signal(sig, handler)
        self._saved_handlers.clear()

    # -- start, restore ----------------------------------------------------------------------------

    def _check_fence(self) -> None:
        marker = read_epoch_marker(self.storage)
        if marker > self.epoch:
            self._mark_stale(marker, "the epoch marker")
        refs = list_checkpoints(self.storage)
        if refs and refs[-1].epoch > self.epoch:
            self._mark_stale(refs[-1].epoch, "the latest checkpoint")

    def _mark_stale(self, current: int, what: str, step: int | None = None) -> None:
        if not self._stale:
            self._stale = True
            self._record("stale", step=step, current_epoch=current)
            self._flush(force=True)
            log.warning("epoch %d fenced out: %s is at epoch %d", self.epoch, what, current)
        raise StaleEpoch(self.epoch, current, what)

    def _claim(self) -> None:
        """Raise the epoch marker to this copy's epoch (refusing if a newer epoch claimed it)."""
        self._check_fence()
        if read_epoch_marker(self.storage) < self.epoch:
            write_epoch_marker(self.storage, self.epoch, at=self.clock(), by="agent", temp_tag=f"e{self.epoch}")
            self._check_fence()  # another copy may have claimed a newer epoch meanwhile

    def _cleanup_temps(self) -> None:
        """Delete temporary files left by crashed writers of older epochs (fenced out for good)."""
        for directory in (CHECKPOINT_DIR, ""):
            for name in self.storage.list_temps(directory):
                e = temp_epoch(name)
                if e is not None and e < self.epoch:
                    self.storage.delete(name)

    def _start(self, restored: Checkpoint | None) -> None:
        self._started = True
        self._record(
            "start",
            job=self.job_id,
            pid=os.getpid(),
            restored_step=restored.step if restored else 0,
            restored_epoch=restored.epoch if restored else None,
            restored_run=restored.run_id if restored else None,
        )
        self._flush(force=True)

    def _ensure_started(self) -> None:
        if not self._started:
            self._claim()
            self._cleanup_temps()
            self._start(None)

    def restore(self) -> Checkpoint | None:
        """Claim the epoch and return the latest checkpoint (None: start from scratch).

        Raises :class:`StaleEpoch` when a newer epoch already owns the job (this copy must exit), and
        :class:`ForeignCheckpoint` when the location holds another job's checkpoint. Calling it again
        returns the same checkpoint.
        """
        if self._restore_done:
            return self._restored
        if self._started:
            raise CheckpointError("restore() must come before the first report() or checkpoint()")
        self._claim()
        self._cleanup_temps()
        ckpt = latest_checkpoint(self.storage)
        if ckpt is not None and ckpt.job_id and ckpt.job_id != self.job_id:
            raise ForeignCheckpoint(
                f"{self.uri} holds a checkpoint of job {ckpt.job_id!r}, not {self.job_id!r}: "
                "give each job its own checkpoint URI"
            )
        self._restored = ckpt
        self._restore_done = True
        self._floor = ckpt.step if ckpt else 0
        if ckpt is not None:
            # The predecessor already answered these requests (its manifest lists its lineage's).
            manifest = read_manifest(self.storage, ckpt.ref)
            for rid in (*(manifest.served_request_ids if manifest else ()), ckpt.request_id):
                if rid:
                    self._served[rid] = None
        self._start(ckpt)
        if ckpt is not None:
            log.info("epoch %d restored step %d (written by epoch %d)", self.epoch, ckpt.step, ckpt.epoch)
        return ckpt

    @property
    def restored(self) -> Checkpoint | None:
        return self._restored

    # -- progress ----------------------------------------------------------------------------------

    def _record(self, event: str, **fields: Any) -> dict[str, Any]:
        rec: dict[str, Any] = {"event": event, "epoch": self.epoch, "run": self.run_id, "t": self.clock()}
        for k, v in fields.items():
            if v is not None:
                rec[k] = v
        if self.on_progress is not None:
            self.on_progress(rec)
        if self.write_progress:
            self._buffer.append(record_line(rec))
        return rec

    def _flush(self, *, force: bool = False) -> None:
        if not self._buffer:
            return
        now = self.clock()
        if not force and now - self._last_flush < self.progress_flush_interval:
            return
        lines, self._buffer = self._buffer, []
        try:
            self.storage.append_lines(progress_name(self.epoch), lines)
        except OSError:
            self._buffer = lines + self._buffer  # keep them for the next flush
            raise
        self._last_flush = now

    def report(self, step: int, **fields: Any) -> None:
        """Record that training step ``step`` (1-based, the count reached) is complete. Extra JSON
        fields (``loss=...``) go into the record."""
        self._ensure_started()
        now = self.clock()
        if self._last_report_at is not None:
            dt = max(0.0, now - self._last_report_at)
            self._step_seconds = dt if self._step_seconds is None else 0.8 * self._step_seconds + 0.2 * dt
        self._last_report_at = now
        self._record("step", step=int(step), **fields)
        self._flush()

    def report_steps(self, first: int, last: int, **fields: Any) -> None:
        """Record that every training step from ``first`` to ``last`` (1-based, inclusive) is complete, in
        one record (``{"event": "step", "step": last, "first": first}``): for loops that log coarsely
        (the simulated cloud's agents). The audit counts each step of the range."""
        first, last = int(first), int(last)
        if not 1 <= first <= last:
            raise CheckpointError(f"a step range needs 1 <= first <= last, got {first}..{last}")
        self._ensure_started()
        n = last - first + 1
        now = self.clock()
        if self._last_report_at is not None:
            self._step_seconds = max(0.0, now - self._last_report_at) / n
        self._last_report_at = now
        self._record("step", step=last, first=first, **fields)
        self._flush()

    def finish(self, step: int, **fields: Any) -> None:
        """Record that the job reached its goal at ``step`` (after its final checkpoint)."""
        self._ensure_started()
        self._record("done", step=int(step), **fields)
        self._flush(force=True)

    # -- checkpoints -------------------------------------------------------------------------------

    def checkpoint(self, step: int, state: Any, *, meta: Mapping[str, Any] | None = None) -> CheckpointRef:
        """Publish ``state`` (bytes or a JSON value) as the checkpoint of ``step``, atomically.

        Raises :class:`StaleEpoch` without leaving anything behind when a newer epoch owns the job,
        and :class:`CheckpointError` for a step older than the one restored or last written.
        """
        step = int(step)
        if step < self._floor:
            raise CheckpointError(
                f"checkpoint of step {step} would go back: step {self._floor} was already restored or written"
            )
        payload, encoding = encode_state(state)
        self._ensure_started()
        t0 = self.clock()
        self._check_fence_for_write(step)
        request_id = str(self._pending_request["id"]) if self._pending_request else None
        header = {
            "job_id": self.job_id,
            "epoch": self.epoch,
            "step": step,
            "run_id": self.run_id,
            "created_at": t0,
            "request_id": request_id,
            "encoding": encoding,
            "meta": dict(meta or {}),
        }
        name = checkpoint_name(self.epoch, step)
        digest = payload_digest(payload)
        data = encode_checkpoint(header, payload, sha256=digest)
        # A manifest left by an earlier checkpoint of this name must never describe this one.
        self.storage.delete(manifest_name(name))
        self.storage.write_atomic(name, data, temp_tag=f"e{self.epoch}")
        marker = read_epoch_marker(self.storage)
        if marker > self.epoch:
            # Lost the race to a newer claim: withdraw the file so nobody restores it.
            self.storage.delete(name)
            self._mark_stale(marker, "the epoch marker (claimed while writing)", step)
        ref = CheckpointRef(self.epoch, step, name)
        if request_id is not None:
            self._served.pop(request_id, None)
            self._served[request_id] = None
        self._publish_manifest(ref, header, len(data), digest)
        self._last_written = ref
        self._floor = step
        self._prune(ref)
        self._pending_request = None
        self._checkpoint_signal = False
        if self._notice is not None:
            self._notice_checkpointed = True
        if self._stop_signal:
            self._stop_checkpointed = True
        self._checkpoint_seconds = max(0.0, self.clock() - t0)
        self._record("checkpoint", step=step, request_id=request_id, seconds=round(self._checkpoint_seconds, 6))
        self._flush(force=True)
        log.info("epoch %d checkpointed step %d", self.epoch, step)
        return ref

    def _check_fence_for_write(self, step: int) -> None:
        marker = read_epoch_marker(self.storage)
        if marker > self.epoch:
            self._mark_stale(marker, "the epoch marker", step)
        if marker < self.epoch:
            # Lowered by an older copy that claimed concurrently (a store has no compare-and-swap):
            # raise it back before writing, so that copy's post-write check withdraws its file.
            write_epoch_marker(self.storage, self.epoch, at=self.clock(), by="agent", temp_tag=f"e{self.epoch}")
        refs = list_checkpoints(self.storage)
        if refs and refs[-1].epoch > self.epoch:
            self._mark_stale(refs[-1].epoch, "the latest checkpoint", step)

    def _publish_manifest(self, ref: CheckpointRef, header: Mapping[str, Any], size: int, digest: str) -> None:
        """Publish the manifest of a just-published checkpoint (what polls read instead of it). A failure
        only costs the pollers a full read of the checkpoint: it is logged, not raised."""
        manifest = Manifest(
            name=ref.name,
            epoch=ref.epoch,
            step=ref.step,
            job_id=self.job_id,
            run_id=self.run_id,
            created_at=float(header["created_at"]),
            request_id=header["request_id"],
            served_request_ids=tuple(self._served)[-MAX_SERVED_IDS:],
            size=size,
            sha256=digest,
            written_at=self.clock(),
        )
        try:
            write_manifest(self.storage, manifest, temp_tag=f"e{self.epoch}")
        except OSError as exc:
            log.warning("could not publish the manifest of %s (pollers will read the checkpoint): %s", ref.name, exc)

    def _prune(self, newest: CheckpointRef) -> None:
        refs = sorted({r for r in list_checkpoints(self.storage) if r <= newest} | {newest})
        for ref in refs[: -self.keep]:
            delete_checkpoint(self.storage, ref.name)

    # -- when to checkpoint, when to stop ------------------------------------------------------------

    def poll(self) -> None:
        """Look for a checkpoint request, a preemption notice and a newer epoch (throttled by the
        clock; a signal forces an immediate look). :meth:`should_checkpoint` and :meth:`should_stop`
        call it."""
        now = self.clock()
        force, self._force_poll = self._force_poll, False
        if force or now >= self._next_request_poll:
            self._next_request_poll = now + self.poll_interval
            req = read_request(self.storage)
            if req is not None:
                rid = str(req["id"])
                target = req.get("epoch")
                if rid not in self._served and (target is None or int(target) == self.epoch):
                    if self._pending_request is None or self._pending_request.get("id") != rid:
                        log.info("checkpoint requested (%s)", rid)
                    self._pending_request = req
        if force or now >= self._next_stale_check:
            self._next_stale_check = now + self.stale_check_interval
            marker = read_epoch_marker(self.storage)
            if marker > self.epoch and not self._stale:
                with contextlib.suppress(StaleEpoch):
                    self._mark_stale(marker, "the epoch marker")
        for i, source in enumerate(self.notice_sources):
            if not force and now < self._source_next.get(i, -math.inf):
                continue
            try:
                notice = source.poll(now)
            except OSError as exc:
                failures = self._source_failures.get(i, 0) + 1
                self._source_failures[i] = failures
                backoff = min(60.0, max(source.interval, 1.0) * 2 ** min(failures, 6))
                self._source_next[i] = now + backoff
                if failures == 1:
                    log.info("notice source %s unreachable (%s); backing off", source.name, exc)
                continue
            self._source_failures[i] = 0
            self._source_next[i] = now + source.interval
            if notice is not None and (self._notice is None or notice.deadline < self._notice.deadline):
                first = self._notice is None
                self._notice = notice
                if first:
                    self._record("notice", source=notice.source, deadline=notice.deadline)
                    self._flush(force=True)
                    log.warning(
                        "preemption notice from %s: %.1f s left, checkpoint within %.1f s",
                        notice.source,
                        notice.remaining(now),
                        notice.checkpoint_by(self.margin) - now,
                    )

    @property
    def notice(self) -> Notice | None:
        """The preemption notice received, if any."""
        return self._notice

    @property
    def deadline(self) -> float | None:
        """When the instance will be taken (Unix seconds), if a notice arrived."""
        return self._notice.deadline if self._notice else None

    def time_left(self) -> float | None:
        """Seconds left to *finish* a checkpoint before a notice's deadline minus the margin
        (None: no notice; negative: too late, checkpoint anyway)."""
        if self._notice is None:
            return None
        return self._notice.checkpoint_by(self.margin) - self.clock()

    def checkpoint_budget(self) -> float:
        """Seconds the lazy policy keeps for a checkpoint: twice the last checkpoint's duration (at
        least ``lazy_min_budget``) plus two training steps."""
        ckpt = 2.0 * (self._checkpoint_seconds or 0.0)
        return max(ckpt, self.lazy_min_budget) + 2.0 * (self._step_seconds or 0.0)

    @property
    def stale(self) -> bool:
        """True once this copy saw a newer epoch: it must stop without writing."""
        return self._stale

    def should_checkpoint(self) -> bool:
        """True when the loop should checkpoint now: a request from the migrator, SIGUSR1 or SIGTERM,
        or a preemption notice (at once, or with the lazy policy when the time left reaches the
        budget). False once fenced out (a checkpoint would be refused)."""
        self.poll()
        if self._stale:
            return False
        if self._checkpoint_signal or self._pending_request is not None:
            return True
        if self._stop_signal and not self._stop_checkpointed:
            return True
        if self._notice is not None and not self._notice_checkpointed:
            if self.notice_policy == "eager":
                return True
            left = self.time_left()
            return left is not None and left <= self.checkpoint_budget()
        return False

    def should_stop(self) -> bool:
        """True when the loop should exit now: fenced out by a newer epoch, or told to stop (SIGTERM)
        or warned of a preemption *and* a checkpoint was written since."""
        self.poll()
        if self._stale:
            return True
        if self._stop_signal and self._stop_checkpointed:
            return True
        return self._notice is not None and self._notice_checkpointed

    # -- end -----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Write buffered progress and put back the previous signal handlers."""
        try:
            self._flush(force=True)
        finally:
            self.restore_signal_handlers()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
