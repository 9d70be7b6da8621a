"""The Prefect wing: the campaign flow, the runner, the local server, the approval form.

Rule (pinned by ``tests/project/test_architecture.py``): this is the only package
of the project that imports Prefect. It adapts the round engine
(``flows._engine``) to a Prefect deployment: one flow run per campaign run,
approvals by ``suspend_flow_run``, one long-lived runner per login node.
"""
