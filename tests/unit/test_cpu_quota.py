"""usable_cores() under a CPU quota (issue 36, item 3): cgroup v2 `cpu.max` as Kubernetes sets it,
and cgroup v1's CFS quota, besides the affinity mask.

The cgroup files are laid out in a temporary folder as the kernel shows them (a /proc/self with
`cgroup` and `mountinfo`, a hierarchy with `cgroup.procs` in each group), so every layout is
tested on any machine; then, as root where the machine lets us make a cgroup, a real quota on a
real process.
"""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from course_utils import env


def _proc(tmp: Path, cgroup_lines: list[str], mounts: list[str]) -> str:
    proc = tmp / "proc-self"
    proc.mkdir()
    (proc / "cgroup").write_text("\n".join(cgroup_lines) + "\n")
    (proc / "mountinfo").write_text("\n".join(mounts) + "\n")
    return str(proc)


def _group(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cgroup.procs").write_text("")
    for name, text in files.items():
        (folder / name.replace("__", ".")).write_text(text + "\n")


def test_a_v2_quota_on_the_way_up_counts_the_smallest(tmp_path):
    mount = tmp_path / "cg2"
    _group(mount)                                                    # the root has no cpu.max
    _group(mount / "kubepods" / "pod1", cpu__max="250000 100000")    # the pod's limit: 2.5 cores
    _group(mount / "kubepods" / "pod1" / "ctr", cpu__max="max 100000")
    proc = _proc(tmp_path, ["0::/kubepods/pod1/ctr"],
                 [f"35 24 0:30 / {mount} rw,nosuid - cgroup2 cgroup2 rw"])
    assert env.cpu_quota_cores(proc) == pytest.approx(2.5)
    (mount / "kubepods" / "pod1" / "ctr" / "cpu.max").write_text("50000 100000\n")   # a tighter one below
    assert env.cpu_quota_cores(proc) == pytest.approx(0.5)


def test_a_container_sees_its_own_cgroup_as_the_root(tmp_path):
    """cgroup namespaces: the mount's root is the container's cgroup, and /proc/self/cgroup may still
    name the full path; both views find the same cpu.max."""
    mount = tmp_path / "cg2"
    _group(mount, cpu__max="150000 100000")
    for line in ("0::/", "0::/kubepods/pod1/ctr"):
        proc_dir = tmp_path / line.replace("/", "_").replace(":", "")
        proc_dir.mkdir()
        proc = _proc(proc_dir, [line], [f"35 24 0:30 /kubepods/pod1/ctr {mount} rw - cgroup2 cgroup2 rw"])
        assert env.cpu_quota_cores(proc) == pytest.approx(1.5), line


def test_no_quota_and_no_cgroups_give_none(tmp_path):
    mount = tmp_path / "cg2"
    _group(mount / "a", cpu__max="max 100000")
    proc = _proc(tmp_path, ["0::/a"], [f"35 24 0:30 / {mount} rw - cgroup2 cgroup2 rw"])
    assert env.cpu_quota_cores(proc) is None
    assert env.cpu_quota_cores(str(tmp_path / "no-such-proc")) is None


def test_cgroup_v1_cfs_quota(tmp_path):
    mount = tmp_path / "cpu,cpuacct"
    _group(mount)
    _group(mount / "docker" / "abc", cpu__cfs_quota_us="-1", cpu__cfs_period_us="100000")
    proc = _proc(tmp_path, ["4:cpu,cpuacct:/docker/abc", "3:memory:/docker/abc", "0::/"],
                 [f"32 31 0:29 / {mount} rw,relatime - cgroup cgroup rw,cpu,cpuacct",
                  f"35 31 0:32 / {tmp_path / 'memory'} rw,relatime - cgroup cgroup rw,memory"])
    assert env.cpu_quota_cores(proc) is None                         # -1: no quota
    (mount / "docker" / "abc" / "cpu.cfs_quota_us").write_text("300000\n")
    assert env.cpu_quota_cores(proc) == pytest.approx(3.0)


@pytest.mark.parametrize("quota, mask, expected", [(None, 8, 8), (2.5, 8, 3), (1.5, 8, 2), (0.4, 8, 1),
                                                   (2.0, 8, 2), (16.0, 4, 4)])
def test_usable_cores_is_the_mask_within_the_quota(monkeypatch, quota, mask, expected):
    """A 1.5-core quota lets two processes run three quarters of the time each: rounded up."""
    monkeypatch.delenv("COURSE_CORES", raising=False)
    monkeypatch.setattr(env, "cpu_quota_cores", lambda *a: quota)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(mask)))
    assert env.usable_cores() == expected
    monkeypatch.setenv("COURSE_CORES", "5")       # the tests' override still wins
    assert env.usable_cores() == 5


def test_print_env_names_the_quota(monkeypatch):
    monkeypatch.setattr(env, "cpu_quota_cores", lambda *a: 1.5)
    assert "a CPU quota of 1.5 cores" in "\n".join(env.env_report().lines())


def _writable_cpu_cgroup() -> tuple[str, Path] | None:
    """A folder where root may make a cgroup with a CPU quota: v2 with the cpu controller, or v1's cpu."""
    if os.geteuid() != 0:
        return None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        dash = fields.index("-")
        point, fstype, options = fields[4], fields[dash + 1], fields[dash + 3].split(",")
        if fstype == "cgroup2" and "cpu" in Path(point, "cgroup.subtree_control").read_text().split():
            return "v2", Path(point)
        if fstype == "cgroup" and "cpu" in options and Path(point, "cgroup.procs").exists():
            return "v1", Path(point)
    return None


def test_a_real_quota_on_a_real_process():
    """As root: a cgroup of our own with half a core, a Python started in it: usable_cores() is 1,
    and the quota 0.5."""
    found = _writable_cpu_cgroup()
    if found is None:
        pytest.skip("needs root and a cgroup hierarchy with the cpu controller we may write to")
    version, mount = found
    group = mount / f"course-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"this machine lets us make no cgroup ({exc})")
    try:
        if version == "v2":
            (group / "cpu.max").write_text("50000 100000")
        else:
            (group / "cpu.cfs_quota_us").write_text("50000")
        code = ("import os; open(os.path.join(os.environ['GROUP'], 'cgroup.procs'), 'w').write(str(os.getpid())); "
                "from course_utils import env; print(env.cpu_quota_cores(), env.usable_cores())")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "GROUP": str(group), "COURSE_CORES": ""})
        assert out.returncode == 0, out.stderr
        quota, cores = out.stdout.split()
        assert float(quota) == pytest.approx(0.5) and int(cores) == 1
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                import time
                time.sleep(0.1)
