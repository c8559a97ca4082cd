"""A real single-node Slurm for tests: Debian's munged, slurmctld, slurmd, slurmdbd and
MariaDB, run as root from a temporary folder on free ports.

What Debian 12 ships (Slurm 22.05.8), found by running it here:
- munged refuses a socket folder that is not world-executable and a key readable by
  others; the clients find the socket through ``AuthInfo=socket=`` (slurmctld, slurmd,
  squeue, scontrol, scancel) and ``AccountingStoragePass=`` (sacct, sacctmgr: the
  connection to slurmdbd), so the system's munged is never touched.
- slurmdbd takes no ``-f``: it reads ``slurmdbd.conf`` from the folder of ``SLURM_CONF``,
  which must be mode 600. MariaDB bootstraps in under a second; slurmctld registers the
  cluster in the accounting database by itself.
- GPUs are eight regular files in ``gres.conf`` (``AutoDetect=off``): slurmd logs that
  they are not devices and counts them. ``AccountingStorageTRES=gres/gpu`` puts
  ``gres/gpu=N`` into a job's allocated TRES; ``squeue --json`` gives the indices as
  ``gres_detail: ["gpu:2(IDX:0-1)"]`` while the job runs and an empty list once it ended.
- ``squeue --json`` (openapi/v0.0.38) lists ended jobs for ``MinJobAge`` seconds and
  ignores its filters; ``scontrol`` has no ``--json`` before 23.02; ``sacct --json``
  (openapi/dbv0.0.38) needs slurmdbd ("Slurm accounting storage is disabled" without).
- With 2 CPUs, ``OverSubscribe=FORCE`` lets more jobs than CPUs share the node; the GPUs
  are never shared.

Every daemon is started by this module and killed by it (by process id) when the fixture
ends, whether the tests passed or not.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "slurmdbd", "mariadbd")
CLIENTS = ("sbatch", "squeue", "sinfo", "scontrol", "scancel", "sacct", "sacctmgr")
DEBIAN_PACKAGES = "slurmctld slurmd slurm-client slurmdbd munge mariadb-server"


def missing_programs() -> list[str]:
    return [p for p in (*DAEMONS, *CLIENTS, "mariadb-install-db") if not shutil.which(p)]


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class SlurmCluster:
    root: Path
    hostname: str
    ports: dict[str, int]
    processes: list[subprocess.Popen] = field(default_factory=list)
    pid_files: list[Path] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True, timeout: float = 30) -> str:
        done = subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr}")
        return done.stdout

    def submit(self, gpus: int, name: str, seconds: int = 3600, **options: str) -> str:
        """A batch job holding ``gpus`` GPUs and sleeping; its job id."""
        extra = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
        out = self.run(
            "sbatch",
            "--parsable",
            f"--gres=gpu:{gpus}",
            f"--job-name={name}",
            "--output=/dev/null",
            f"--chdir={self.root}",
            *extra,
            f"--wrap=sleep {seconds}",
        )
        return out.strip().split(";")[0]

    def state(self, job_id: str) -> str:
        out = self.run("scontrol", "-o", "show", "job", job_id)
        return out.split("JobState=", 1)[1].split()[0]

    def wait_state(self, job_id: str, states: set[str], timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while True:
            state = self.state(job_id)
            if state in states or time.monotonic() > deadline:
                return state
            time.sleep(0.2)

    def cancel_all(self) -> None:
        self.run("scancel", "--user=root", check=False)

    def log(self, name: str) -> str:
        path = self.root / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        # Jobs first, so their slurmstepd (which slurmd double-forks away from itself)
        # ends on its own; then the daemons by pid file; then whatever still carries this
        # cluster's SLURM_CONF in its environment (job steps, their sleeps).
        if self.conf.exists():
            self.run("scancel", "--user=root", check=False, timeout=10)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and self._stray():
                time.sleep(0.1)
        pids = []
        for pid_file in self.pid_files:
            try:
                pids.append(int(pid_file.read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                continue
        pids += [p.pid for p in self.processes if p.poll() is None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in [*pids, *self._stray()]:
                _kill(pid, sig)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(_alive(p) for p in [*pids, *self._stray()]):
                time.sleep(0.1)
        for p in self.processes:
            with suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)

    def _stray(self) -> list[int]:
        """Live processes (other than this one) started with this cluster's SLURM_CONF."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0") and _alive(int(entry.name)):
                found.append(int(entry.name))
        return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return "Z" not in (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1][:3]
    except OSError:
        return False


def _kill(pid: int, sig: int) -> None:
    with suppress(OSError):
        os.kill(pid, sig)


def _node_line(hostname: str) -> str:
    """The node as slurmd sees it (``slurmd -C``): CPUs, sockets, cores, memory."""
    probe = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    line = probe.splitlines()[0]
    fields = dict(item.split("=", 1) for item in line.split())
    keep = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    return f"NodeName={hostname} " + " ".join(f"{k}={fields[k]}" for k in keep if k in fields)


def _wait(predicate, what: str, timeout: float, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            tails = "\n".join(
                f"--- {p}\n{p.read_text(errors='replace')[-2000:]}" for p in logs if p.exists()
            )
            raise RuntimeError(f"test Slurm: {what} did not come up in {timeout:.0f} s\n{tails}")
        time.sleep(0.1)


@contextmanager
def slurm_cluster(root: Path, partitions: dict[str, str] | None = None):
    """Start the cluster under ``root``; yields a ``SlurmCluster``; stops every daemon.

    ``partitions``: name -> extra options; the first is the default partition.
    """
    partitions = partitions or {"gpu": "", "debug": ""}
    hostname = socket.gethostname()
    names = ("slurmctld", "slurmd", "slurmdbd", "mysql")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    for sub in ("etc", "run", "munge", "state", "spool", "log", "gpu", "mysql"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    os.chmod(root / "run", 0o755)  # munged: its socket's folder is world-executable
    os.chmod(root / "munge", 0o700)
    (root / "spool" / hostname).mkdir(exist_ok=True)
    cluster = SlurmCluster(root=root, hostname=hostname, ports=ports)
    munge_socket = root / "run" / "munge.sock"
    try:
        key = root / "munge" / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
        os.chmod(key, 0o400)
        subprocess.run(
            [
                "munged",
                f"--socket={munge_socket}",
                f"--key-file={key}",
                f"--pid-file={root / 'run' / 'munged.pid'}",
                f"--log-file={root / 'log' / 'munged.log'}",
                f"--seed-file={root / 'munge' / 'munged.seed'}",
            ],
            check=True,
        )
        cluster.pid_files.append(root / "run" / "munged.pid")

        datadir = root / "mysql" / "data"
        subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={datadir}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--user=root",
            ],
            check=True,
            capture_output=True,
        )
        cluster.processes.append(
            subprocess.Popen(
                [
                    "mariadbd",
                    "--no-defaults",
                    f"--datadir={datadir}",
                    f"--socket={root / 'mysql' / 'mysql.sock'}",
                    f"--port={ports['mysql']}",
                    "--bind-address=127.0.0.1",
                    "--user=root",
                    f"--pid-file={root / 'mysql' / 'mariadbd.pid'}",
                    f"--log-error={root / 'log' / 'mariadbd.log'}",
                    "--innodb-buffer-pool-size=32M",
                    "--skip-log-bin",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

        gpus = []
        for index in range(8):
            device = root / "gpu" / f"nvidia{index}"
            device.touch()
            gpus.append(device)
        etc = root / "etc"
        (etc / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={hostname} Name=gpu File={root / 'gpu'}/nvidia[0-7]\n"
        )
        partition_lines = [
            f"PartitionName={name} Nodes={hostname} Default={'YES' if n == 0 else 'NO'} "
            f"MaxTime=INFINITE State=UP OverSubscribe=FORCE:8 {extra}".rstrip()
            for n, (name, extra) in enumerate(partitions.items())
        ]
        run = root / "run"
        cluster.conf.write_text(
            "\n".join(
                [
                    "ClusterName=audittest",
                    f"SlurmctldHost={hostname}(127.0.0.1)",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"SlurmctldPort={ports['slurmctld']}",
                    f"SlurmdPort={ports['slurmd']}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={munge_socket}",
                    f"StateSaveLocation={root / 'state'}",
                    f"SlurmdSpoolDir={root / 'spool'}/%n",
                    f"SlurmctldPidFile={run / 'slurmctld.pid'}",
                    f"SlurmdPidFile={run / 'slurmd.pid'}",
                    f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "GresTypes=gpu",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/slurmdbd",
                    "AccountingStorageHost=127.0.0.1",
                    f"AccountingStoragePort={ports['slurmdbd']}",
                    f"AccountingStoragePass={munge_socket}",
                    "AccountingStorageTRES=gres/gpu",
                    "JobCompType=jobcomp/none",
                    "SchedulerType=sched/backfill",
                    "SchedulerParameters=sched_min_interval=100000",
                    "ReturnToService=2",
                    "MpiDefault=none",
                    "MailProg=/bin/true",
                    "MinJobAge=600",
                    "SlurmctldTimeout=30",
                    "SlurmdTimeout=30",
                    f"{_node_line(hostname)} Gres=gpu:8 State=UNKNOWN",
                    *partition_lines,
                    "",
                ]
            )
        )
        dbd = etc / "slurmdbd.conf"
        dbd.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={munge_socket}",
                    "DbdHost=localhost",
                    "DbdAddr=127.0.0.1",
                    f"DbdPort={ports['slurmdbd']}",
                    "SlurmUser=root",
                    f"LogFile={root / 'log' / 'slurmdbd.log'}",
                    f"PidFile={run / 'slurmdbd.pid'}",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={ports['mysql']}",
                    "StorageUser=root",
                    "StorageLoc=slurm_acct_db",
                    "",
                ]
            )
        )
        os.chmod(dbd, 0o600)
        logs = [root / "log" / f"{n}.log" for n in ("mariadbd", "slurmdbd", "slurmctld", "slurmd")]
        _wait(lambda: _port_open(ports["mysql"]), "MariaDB", 30, logs)
        env = cluster.env
        cluster.processes.append(
            subprocess.Popen(
                ["slurmdbd", "-D"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
            )
        )
        _wait(lambda: _port_open(ports["slurmdbd"]), "slurmdbd", 30, logs)
        subprocess.run(["slurmctld", "-f", str(cluster.conf)], env=env, check=True)
        cluster.pid_files.append(run / "slurmctld.pid")
        subprocess.run(["slurmd", "-f", str(cluster.conf)], env=env, check=True)
        cluster.pid_files.append(run / "slurmd.pid")
        _wait(lambda: _node_idle(cluster), "the node", 60, logs)
        yield cluster
    finally:
        cluster.stop()


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _node_idle(cluster: SlurmCluster) -> bool:
    done = subprocess.run(
        ["sinfo", "-h", "-o", "%t"], env=cluster.env, capture_output=True, text=True
    )
    return done.returncode == 0 and done.stdout.split()[:1] == ["idle"]
