"""Run by test_test_environment.py in a child pytest: what a test sees of its environment."""

import os


def test_no_allocation_variable_reaches_a_test():
    leaked = sorted(k for k in os.environ if k.startswith(("SLURM_", "UNATTENDED_")))
    assert leaked == []
