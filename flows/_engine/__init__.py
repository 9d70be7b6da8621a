"""The round engine: one campaign, round after round, with no Prefect.

Rule (pinned by ``tests/project/test_architecture.py``): nothing in this package
imports Prefect, at module level or lazily, and nothing here prints. The engine
talks to the provenance database through :class:`flows._engine._store.CampaignStore`
and to the allocation through ``tasks``' public names. The Prefect flow
(``flows._prefect``) and the direct runner both drive :class:`CampaignEngine`.
"""
