"""scripts/on-device.sh puts the folder it unpacks the bundle into first on PYTHONPATH: that
folder is made private, and one that another user could write to is refused (exit 2, one
line). Run with no bundle and a command after ``--``: seconds, nothing unpacked."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _on_device(tmp_path: Path, dest: Path) -> subprocess.CompletedProcess:
    (tmp_path / "bundle").mkdir(exist_ok=True)  # empty: nothing to unpack
    env = dict(os.environ, PYTHON=sys.executable, RAYPEFT_BUNDLE=str(tmp_path / "bundle"))
    env["RAYPEFT_DEVICE_DIR"] = str(dest)
    return subprocess.run(
        ["bash", "scripts/on-device.sh", "--", "sh", "-c", 'echo "$PYTHONPATH"'],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_unpacked_bundle_is_a_private_folder_first_on_the_path(tmp_path):
    dest = tmp_path / "unpacked"
    proc = _on_device(tmp_path, dest)
    assert proc.returncode == 0, proc.stderr
    path = proc.stdout.splitlines()[-1]  # after its note that there is no bundle
    assert path.startswith(f"{dest}/site:{dest}/core:{dest}/data:{REPO}")
    assert stat.S_IMODE(dest.stat().st_mode) == 0o700
    assert _on_device(tmp_path, dest).returncode == 0  # reused as it is


def test_a_folder_others_may_write_to_is_refused(tmp_path):
    dest = tmp_path / "unpacked"
    dest.mkdir()
    dest.chmod(0o775)
    proc = _on_device(tmp_path, dest)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"on-device: {dest} has mode 775: other users may change what goes on PYTHONPATH; "
        f"make it private (chmod 700 {dest})"
    ]
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "bundle")
    proc = _on_device(tmp_path, link)
    assert proc.returncode == 2 and "is a symbolic link, not a folder" in proc.stderr
