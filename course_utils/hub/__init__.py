"""A workshop on JupyterHub (`make hub`): one address for the room, a server, cores and a GPU per
learner, the instructor as the hub's admin, and the class's gradebook at the end (`make collect`).

- `settings`: what the instructor sets (HUB_LEARNERS, HUB_ADMIN, HUB_PASSWORD, HUB_PORT, HUB_IP,
  HUB_STATE, HUB_SHARED, HUB_MEMORY, HUB_SINGLE_USER) and the state folder's secrets;
- `accounts`: one OS user per learner (as root), a home of their own with a copy of the student
  notebooks made once;
- `learner_env`: the learners' Python (the system's interpreter with the course's packages, in a
  shared read-only place they can execute), a snapshot of the course's code and the data;
- `resources`: cores by affinity mask, a memory cap (cgroup) and a GPU each;
- `spawner`: the spawner that starts each learner's server with those;
- `jupyterhub_config.py`: the hub's configuration, read from the plan `run` writes;
- `run`: `python -m course_utils.hub`, what `make hub` runs; `procs`: nothing left running;
- `auth`: a password per learner (HUB_PASSWORDS=each), where the shared one would let learners log
  in as each other;
- `collect`: `make collect LESSON=NN`, each learner's notebook into submissions/, then graded.

INSTRUCTORS.md ("A workshop on JupyterHub") says how to run a room with it, and when to use the
cluster settings in hub/ (Zero to JupyterHub, batchspawner on SLURM) instead.
"""
