"""The agent runs in a training image that carries nothing but Python: no third-party import, ever,
unless a checkpoint URI names a remote store (then fsspec, lazily)."""

from __future__ import annotations

import subprocess
import sys

from costopt.agent import Agent, control
from costopt.agent.storage import FsspecStorage, open_storage
from costopt.settings import PROJECT_ROOT

# Run with -S (no site-packages at all) and the project root alone on the path: any third-party
# import fails; a sys.modules check then proves every loaded module is the standard library's.
PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import costopt.agent, costopt.agent.control, costopt.agent.notices, costopt.agent.progress
from costopt.agent import Agent, control
a = Agent("j", sys.argv[2], 1)
a.restore()
a.report(1)
a.checkpoint(1, {"w": [1.0]})
a.finish(1)
assert control.audit_job(sys.argv[2], 1).ok
b = Agent("j", sys.argv[2], 2)
assert b.restore().state == {"w": [1.0]}
third_party = sorted(
    m for m in sys.modules
    if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] not in ("costopt", "__main__")
)
assert not third_party, third_party
assert "site" not in sys.modules
print("stdlib-only")
"""


def test_the_agent_imports_and_runs_with_the_standard_library_alone(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-S", "-c", PROBE, str(PROJECT_ROOT), str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "stdlib-only"


def test_fsspec_is_imported_only_when_a_remote_uri_is_opened(tmp_path):
    code = (
        "import sys\n"
        "from costopt.agent import Agent\n"
        f"a = Agent('j', {str(tmp_path / 'c')!r}, 1); a.restore(); a.checkpoint(1, b'x')\n"
        "assert 'fsspec' not in sys.modules, 'fsspec imported for a local URI'\n"
        "from costopt.agent.storage import open_storage\n"
        "open_storage('memory://bucket/job')\n"
        "assert 'fsspec' in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=PROJECT_ROOT)
    assert proc.returncode == 0, proc.stderr


def test_a_job_checkpoints_restores_and_is_audited_on_an_object_store(clock):
    uri = "memory://costopt-test-bucket/job-9"
    storage = open_storage(uri)
    assert isinstance(storage, FsspecStorage) and storage.atomic_put
    first = Agent("job-9", uri, 1, clock=clock, progress_flush_interval=10.0)
    first.restore()
    for step in range(1, 6):
        first.report(step)
        clock.advance(1.0)
    first.checkpoint(5, b"state-5")
    first.close()
    control.claim_epoch(uri, 2)
    second = Agent("job-9", uri, 2, clock=clock)
    ckpt = second.restore()
    assert ckpt is not None and (ckpt.step, ckpt.state) == (5, b"state-5")
    for step in range(6, 9):
        second.report(step)
    second.checkpoint(8, b"state-8")
    second.finish(8)
    second.close()
    result = control.audit_job(uri, 8)
    assert result.ok, result.problems
    assert control.progress(uri, 2).progressing
    storage.fs.rm(storage.root, recursive=True)
