"""The storage behind a path: mount point, file system, block device and what kind of disk it
is (lessons 00, 01 and 04).

`disk_of(path)` names the block device and file system behind any path (Linux reads /sys and
/proc/mounts; elsewhere it says 'unknown'). Nothing here needs root. `course_utils.hardware`
(the machine's facts) and `course_utils.io_probe` (reading the disk) both use it; it imports
neither, so neither imports the other for it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = ["DiskInfo", "disk_of", "NETWORK_FILESYSTEMS"]

NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "ceph", "beegfs",
                       "glusterfs", "9p", "virtiofs", "fuse.s3fs", "fuse.gcsfuse", "fuse.sshfs")


# -- the disk behind a path -------------------------------------------------------------------

@dataclass(frozen=True)
class DiskInfo:
    """The storage behind a path: mount point, file system, block device, and what kind it is."""
    path: str
    mount: str = "?"
    fstype: str = "?"
    device: str | None = None        # the block device of the mount, e.g. vda, nvme0n1p2, sda1
    disk: str | None = None          # the whole disk it belongs to, e.g. vda, nvme0n1, sda
    rotational: bool | None = None   # what the kernel reports (virtual disks often say True)
    model: str | None = None
    size_gib: float | None = None
    kind: str = "unknown"

    @property
    def label(self) -> str:
        """One line for figures and tables: device, kind and file system."""
        where = self.device or self.fstype
        model = f", {self.model}" if self.model else ""
        return f"{where}: {self.kind}{model}, {self.fstype} at {self.mount}"


def _mounts() -> list[tuple[str, str, str]]:
    """(device, mount point, fstype) of every mount, from /proc/mounts (Linux) or psutil."""
    try:
        with open("/proc/mounts") as f:
            rows = [line.split()[:3] for line in f if len(line.split()) >= 3]
        return [(dev, mnt.replace("\\040", " "), fs) for dev, mnt, fs in rows]
    except OSError:
        return [(p.device, p.mountpoint, p.fstype) for p in psutil.disk_partitions(all=True)]


def _read_sys(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _disk_kind(fstype: str, disk: str | None, rotational: bool | None) -> str:
    fs = fstype.lower()
    if fs in ("tmpfs", "ramfs"):
        return "RAM (tmpfs): a RAM disk"
    if fs in NETWORK_FILESYSTEMS or fs.startswith("fuse."):
        return "network or distributed file system"
    if fs == "overlay":
        return "container overlay file system (the disk underneath is not visible)"
    if disk is None:
        return "unknown"
    if disk.startswith("nvme"):
        return "NVMe SSD"
    if disk.startswith(("vd", "xvd")):
        return "virtual disk (the host's storage underneath is not visible)"
    if disk.startswith(("zram", "ram")):
        return "RAM block device"
    if disk.startswith("loop"):
        return "loop device (a file on another disk)"
    if disk.startswith(("md", "dm-")):
        return "RAID or device-mapper volume"
    if rotational is True:
        return "rotational disk (HDD)"
    if rotational is False:
        return "SSD"
    return "unknown"


def disk_of(path) -> DiskInfo:
    """The mount, file system and block device holding `path`, and what kind of storage it is
    (NVMe SSD, SSD, HDD, virtual disk, RAM disk, network file system...). Linux only reads
    /proc/mounts and /sys; elsewhere the kind is 'unknown' (lesson 00)."""
    real = os.path.realpath(path)
    mount, fstype = "?", "?"
    for _, mnt, fs in _mounts():           # the longest mount point above the path (the last one wins)
        top = mnt.rstrip("/") or "/"
        if (top == "/" or real == top or real.startswith(top + "/")) and (mount == "?" or len(top) >= len(mount)):
            mount, fstype = top, fs
    device = disk = model = None
    rotational = size_gib = None
    try:
        st = os.stat(real)
        major, minor = os.major(st.st_dev), os.minor(st.st_dev)
        sys_dev = Path(f"/sys/dev/block/{major}:{minor}")
        if major != 0 and sys_dev.exists():
            resolved = sys_dev.resolve()
            device = resolved.name
            disk = resolved.parent.name if (resolved / "partition").exists() else device
    except OSError:
        pass
    if disk is not None:
        block = Path("/sys/block") / disk
        flag = _read_sys(block / "queue" / "rotational")
        rotational = None if flag is None else flag == "1"
        model = _read_sys(block / "device" / "model")
        sectors = _read_sys(block / "size")
        size_gib = int(sectors) * 512 / 2**30 if sectors and sectors.isdigit() else None
    return DiskInfo(path=str(path), mount=mount, fstype=fstype, device=device, disk=disk, rotational=rotational,
                    model=model, size_gib=size_gib, kind=_disk_kind(fstype, disk, rotational))
