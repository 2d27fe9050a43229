"""A password per learner, for a room where learners must not be able to log in as each other.

JupyterHub's SharedPasswordAuthenticator (the hub's default: one password for the workshop) lets
anyone who has the password log in as ANY learner, by typing that learner's name: it keeps the
world out, not the learners from each other's servers (the accounts keep their files apart only
from each other's code). With HUB_PASSWORDS=each, `make hub` gives every learner a password of
their own (generated once, in the state folder, printed for handing out) and this authenticator
checks it; the admin still logs in with the admin's password.
"""
from __future__ import annotations

from hmac import compare_digest

from jupyterhub.authenticators.shared import SharedPasswordAuthenticator
from traitlets import Dict, Unicode

__all__ = ["LearnerPasswordAuthenticator"]


class LearnerPasswordAuthenticator(SharedPasswordAuthenticator):
    """SharedPasswordAuthenticator with one password per learner (`learner_passwords`)."""

    learner_passwords = Dict(key_trait=Unicode(), value_trait=Unicode(), config=True,
                             help="each learner's own password, by login name")

    def check_allow_config(self):
        if not self.learner_passwords:
            super().check_allow_config()

    async def authenticate(self, handler, data):
        name = self.normalize_username(data["username"])
        if name in self.learner_passwords:
            if compare_digest(data["password"].encode(), self.learner_passwords[name].encode()):
                return {"name": name, "admin": False, "groups": []}
            return None
        return await super().authenticate(handler, data)
