"""hub/slurm/jupyterhub_config.py (batchspawner on SLURM) without a SLURM cluster: every setting it
makes is a real configurable of the class it names (JupyterHub 6, batchspawner 1.3, as installed by
hub/requirements.txt), and the batch script batchspawner renders from it asks for what the course
needs (a GPU, 8 cores, 32 GB, the learner's copy made once, the shared data) and is valid bash.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "hub" / "slurm" / "jupyterhub_config.py"

batchspawner = pytest.importorskip("batchspawner", reason="batchspawner comes with the hub's packages: make hub-deps")


@pytest.fixture(scope="module")
def config():
    """The file as JupyterHub loads it (with HUB_LEARNERS set as the instructor would)."""
    import os

    from traitlets.config.loader import PyFileConfigLoader
    previous = os.environ.get("HUB_LEARNERS")
    os.environ["HUB_LEARNERS"] = "alice,bob"
    try:
        return PyFileConfigLoader(CONFIG.name, path=str(CONFIG.parent)).load_config()
    finally:
        if previous is None:
            os.environ.pop("HUB_LEARNERS", None)
        else:
            os.environ["HUB_LEARNERS"] = previous


def test_every_setting_is_a_real_one(config):
    from jupyterhub.app import JupyterHub
    from jupyterhub.auth import Authenticator
    classes = {"JupyterHub": JupyterHub, "Authenticator": Authenticator, "Spawner": batchspawner.SlurmSpawner,
               "SlurmSpawner": batchspawner.SlurmSpawner}
    assert set(config) <= set(classes), set(config) - set(classes)
    for name, settings in config.items():
        known = set(classes[name].class_trait_names(config=True))
        assert set(settings) <= known, (name, set(settings) - known)
    assert config.JupyterHub.spawner_class == "batchspawner.SlurmSpawner"
    assert config.Authenticator.allowed_users == {"alice", "bob"}


def test_the_batch_script_asks_for_what_the_course_needs(config, tmp_path):
    user = SimpleNamespace(name="nobody", escaped_name="nobody", url="/user/nobody/", server=None, id=1)
    hub = SimpleNamespace(api_url="http://10.0.0.1:8081/hub/api", base_url="/hub/", public_host="", url="/hub/")
    spawner = batchspawner.SlurmSpawner(config=config, user=user, hub=hub)
    subvars = spawner.get_req_subvars()
    subvars["cmd"] = " ".join([spawner.batchspawner_singleuser_cmd] + spawner.cmd)
    script = batchspawner.batchspawner.format_template(spawner.batch_script, **subvars)
    for line in ("#SBATCH --gres=gpu:1", "#SBATCH --cpus-per-task=8", "#SBATCH --mem=32G", "#SBATCH --partition=gpu",
                 "#SBATCH --time=04:00:00", '[ -e "$HOME/feed-the-gpu" ] || cp -r /shared/feed-the-gpu/notebooks',
                 "srun --cpu-bind=cores /shared/feed-the-gpu/.venv/bin/batchspawner-singleuser "
                 "/shared/feed-the-gpu/.venv/bin/jupyterhub-singleuser"):
        assert line in script, (line, script)
    (tmp_path / "job.sh").write_text(script)
    syntax = subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    assert spawner.environment["COURSE_DATA"] == "/shared/feed-the-gpu/data/cifar"
    assert (ROOT / "notebooks" / spawner.default_url.rsplit("/", 1)[-1]).exists()
