"""Feed the GPU at an HPC centre: JupyterHub with batchspawner, each learner's server a SLURM job on
a GPU node (INSTRUCTORS.md, "Beyond one machine", says when to use this rather than `make hub`).

Where it runs: JupyterHub (6.x, with batchspawner 1.3: hub/requirements.txt) on a login or service
node that can submit jobs (sbatch, squeue, scancel) as the learners, who have accounts of their own
at the centre (so JupyterHub's PAM login, not a shared password). The course lives on a filesystem
every compute node mounts, installed once by the centre's staff:

    cd /shared/feed-the-gpu && git clone <the course> . && make venv PYTHON=/usr/bin/python3.11
    .venv/bin/pip install -r hub/requirements.txt             # jupyterhub-singleuser, batchspawner-singleuser
    .venv/bin/python -m course_utils.data --regenerate /shared/feed-the-gpu/data/cifar
    chmod -R a+rX,go-w /shared/feed-the-gpu                   # readable, not writable, by the learners

(build .venv from a Python every learner can run: not one under /root.) Each job asks for one GPU
(or a MIG slice), 8 cores and 32 GB; SLURM's cgroups confine the job to them, and the course reads the
cores it was given (`usable_cores()`). The learner's copy of the notebooks is made in their home on
the first job, never overwritten after. Start the hub with
`HUB_LEARNERS=alice,bob HUB_ADMIN=teacher jupyterhub -f hub/slurm/jupyterhub_config.py`.
"""
import os

c = get_config()  # noqa: F821 (JupyterHub provides it)
COURSE = os.environ.get("FEED_THE_GPU", "/shared/feed-the-gpu")   # where the course is installed, on every node

# learners log in with their centre account; the instructor is the admin
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = {n.strip() for n in os.environ.get("HUB_LEARNERS", "").split(",") if n.strip()}
c.Authenticator.admin_users = {os.environ.get("HUB_ADMIN", "instructor")}
c.JupyterHub.hub_connect_ip = os.environ.get("HUB_CONNECT_IP", "")   # the address compute nodes reach the hub at

c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
c.Spawner.cmd = [f"{COURSE}/.venv/bin/jupyterhub-singleuser"]
c.SlurmSpawner.batchspawner_singleuser_cmd = f"{COURSE}/.venv/bin/batchspawner-singleuser"
c.Spawner.notebook_dir = "~"
c.Spawner.default_url = "/lab/tree/feed-the-gpu/00-welcome-and-setup.ipynb"
c.Spawner.start_timeout = 900                  # a job may wait in the queue
c.Spawner.http_timeout = 300
c.Spawner.environment = {
    "COURSE_DATA": f"{COURSE}/data/cifar",      # prepared once, read-only
    "JUPYTER_CONFIG_PATH": f"{COURSE}/.jupyter",
}

# the job each learner's server runs in
c.SlurmSpawner.req_partition = "gpu"
c.SlurmSpawner.req_runtime = "04:00:00"        # a workshop day's session; the job ends the server
c.SlurmSpawner.req_nprocs = "8"                # cores per GPU: the course's advice
c.SlurmSpawner.req_memory = "32G"
c.SlurmSpawner.req_gres = "gpu:1"              # a MIG slice where the centre's gres.conf names them: "gpu:1g.10gb:1"
c.SlurmSpawner.req_srun = "srun --cpu-bind=cores"
c.SlurmSpawner.req_prologue = f"""[ -e "$HOME/feed-the-gpu" ] || cp -r {COURSE}/notebooks "$HOME/feed-the-gpu"
export COURSE_DATA_HOME="$HOME/.feed-the-gpu-data"
export OMP_NUM_THREADS="${{SLURM_CPUS_PER_TASK:-8}}"
"""
c.SlurmSpawner.batch_script = """#!/bin/bash
#SBATCH --output={{homedir}}/feed-the-gpu-%j.log
#SBATCH --job-name=feed-the-gpu
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
#SBATCH --get-user-env=L
{% if partition  %}#SBATCH --partition={{partition}}
{% endif %}{% if runtime    %}#SBATCH --time={{runtime}}
{% endif %}{% if memory     %}#SBATCH --mem={{memory}}
{% endif %}{% if gres       %}#SBATCH --gres={{gres}}
{% endif %}{% if nprocs     %}#SBATCH --cpus-per-task={{nprocs}}
{% endif %}{% if reservation%}#SBATCH --reservation={{reservation}}
{% endif %}{% if options    %}#SBATCH {{options}}{% endif %}

set -euo pipefail
trap 'echo SIGTERM received' TERM
{{prologue}}
{% if srun %}{{srun}} {% endif %}{{cmd}}
echo "jupyterhub-singleuser ended gracefully"
{{epilogue}}
"""
