"""JupyterHub's configuration for `make hub`, read from the plan `course_utils.hub.run` writes.

JupyterHub executes this file (`jupyterhub -f`); `COURSE_HUB_PLAN` names the plan (the state
folder's plan.json) and the passwords arrive in the hub's environment, which this file empties of
them before the proxy and the learners' servers start.
"""
import json
import os
from pathlib import Path

c = get_config()  # noqa: F821 (JupyterHub provides it)
plan = json.loads(Path(os.environ["COURSE_HUB_PLAN"]).read_text())
state = Path(plan["state"])

# where the room connects, and the hub's own ports (on this machine only)
c.JupyterHub.ip = plan["ip"]
c.JupyterHub.port = plan["port"]
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = plan["hub_port"]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{plan['proxy_api_port']}"
c.ConfigurableHTTPProxy.command = [plan["proxy"]]
c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")

# the state: one folder (make hub-clean removes it)
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state / "jupyterhub.pid")

# who logs in: the learners with the workshop's shared password (or each with their own: HUB_PASSWORDS=each,
# course_utils.hub.auth), the instructor as the admin with the admin's password
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = os.environ.pop("COURSE_HUB_PASSWORD")
c.SharedPasswordAuthenticator.admin_password = os.environ.pop("COURSE_HUB_ADMIN_PASSWORD")
each = os.environ.pop("COURSE_HUB_LEARNER_PASSWORDS", None)
if each:
    c.JupyterHub.authenticator_class = "course_utils.hub.auth.LearnerPasswordAuthenticator"
    c.LearnerPasswordAuthenticator.learner_passwords = json.loads(each)
    c.LearnerPasswordAuthenticator.admin_password = c.SharedPasswordAuthenticator.admin_password
    c.SharedPasswordAuthenticator.user_password = None
c.Authenticator.allowed_users = set(plan["learners"])
c.Authenticator.admin_users = {plan["admin"]} if plan.get("admin") else set()

# each learner's server: their own account, seat and copy of the course (course_utils.hub.spawner)
c.JupyterHub.spawner_class = "course_utils.hub.spawner.CourseSpawner"
c.CourseSpawner.plan = plan
c.Spawner.cmd = [plan["python"], "-m", "jupyterhub.singleuser"]
c.Spawner.notebook_dir = "~"
c.Spawner.default_url = "/lab/tree/feed-the-gpu/00-welcome-and-setup.ipynb"
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 120
c.LocalProcessSpawner.interrupt_timeout = 10
c.LocalProcessSpawner.term_timeout = 5

# Ctrl-C or SIGTERM: every learner's server and the proxy stop with the hub
c.JupyterHub.cleanup_servers = True
c.JupyterHub.cleanup_proxy = True
