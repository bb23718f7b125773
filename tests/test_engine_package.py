"""What importing the ``engine`` package does before torch loads: torch's OpenMP threads are asked to sleep when
idle (OMP_WAIT_POLICY=PASSIVE, see engine/__init__.py) unless the user chose a policy or torch came first."""

from __future__ import annotations

import os
import subprocess
import sys

CODE = "import os, sys; {pre}import engine; print(os.environ.get('OMP_WAIT_POLICY'))"


def _policy(pre: str = "", env_policy: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    out = subprocess.run([sys.executable, "-c", CODE.format(pre=pre)], env=env, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def test_engine_asks_torchs_openmp_threads_to_sleep_when_idle():
    assert _policy() == "PASSIVE"


def test_a_policy_the_user_set_is_kept():
    assert _policy(env_policy="ACTIVE") == "ACTIVE"


def test_nothing_is_set_once_torch_has_loaded_its_openmp():
    assert _policy(pre="import torch; ") == "None"
