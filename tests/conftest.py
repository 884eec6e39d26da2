"""Shared fixtures. Profiles: ``pytest --hypothesis-profile=thorough`` runs 20x more
random cases than the default CI profile."""

from hypothesis import settings

import raycluster

raycluster.set_session_env()     # before anything imports Ray (it reads them then)

settings.register_profile("ci", max_examples=50, deadline=None, database=None)
settings.register_profile("thorough", max_examples=1000, deadline=None, database=None)
settings.load_profile("ci")
