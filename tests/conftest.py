"""Shared fixtures. Profiles: ``pytest --hypothesis-profile=thorough`` runs 20x more
random cases than the default CI profile."""

import atexit
import os
import secrets
import shutil
import tempfile

from hypothesis import settings

# Ray reads its settings when first imported: every Ray cluster and driver of this test
# session (tests/raycluster.py, and the antdt processes they start, which inherit them)
# uses token authentication, 127.0.0.1 and fast node-death detection
from antdt_tf.backends.ray_settings import FAST_HEALTH_CHECKS, RAY_ENV  # noqa: E402

_RAY_TMPDIR = tempfile.mkdtemp(prefix="ray", dir="/tmp")    # short: Ray's socket paths
os.environ.update(RAY_ENV, **FAST_HEALTH_CHECKS, RAY_AUTH_TOKEN=secrets.token_hex(16),
                  RAY_TMPDIR=_RAY_TMPDIR)
atexit.register(shutil.rmtree, _RAY_TMPDIR, True)

settings.register_profile("ci", max_examples=50, deadline=None, database=None)
settings.register_profile("thorough", max_examples=1000, deadline=None, database=None)
settings.load_profile("ci")
