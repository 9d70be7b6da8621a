"""Validate crates with roc-validator, offline: ``python crate_validator.py CACHE CRATE...``.

Prints one JSON object, by crate: ``{crate: {"passed": bool, "issues": [[severity,
check, message, entity]]}}`` for the ``provenance-run-crate-0.5`` profile at the
REQUIRED level. One process validates them all (the profiles load once).

The validator resolves the crate's ``@context`` (``https://w3id.org/ro/crate/1.1/context``)
through its own HTTP cache (``requests-cache``), and in offline mode only from it. The
cache is seeded here with the RO-Crate 1.1 context derived from the copy the ``rocrate``
package ships (RO-Crate 1.3's): the four bioschemas terms whose IRIs the RO-Crate
specification lists as changed since 1.1 (``ComputationalWorkflow``,
``FormalParameter``, ``input``, ``output``) are set back to their 1.1 IRIs; every other
term of 1.1 is unchanged in 1.3. No network is used: the validator runs offline.

Run in its own process: the validator keeps its HTTP session and loaded profiles in
module-level singletons.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

CONTEXT_URL = "https://w3id.org/ro/crate/1.1/context"
# RO-Crate 1.3 -> 1.1 IRIs (the RO-Crate specification's table of changed mappings).
IRIS_1_1 = {
    "ComputationalWorkflow": "https://bioschemas.org/ComputationalWorkflow",
    "FormalParameter": "https://bioschemas.org/FormalParameter",
    "input": "https://bioschemas.org/ComputationalWorkflow#input",
    "output": "https://bioschemas.org/ComputationalWorkflow#output",
}


def context_1_1() -> bytes:
    """Return the RO-Crate 1.1 context document, derived from ``rocrate``'s shipped copy."""
    import rocrate

    shipped = json.loads((Path(rocrate.__file__).parent / "data" / "ro-crate.jsonld").read_text())
    terms = dict(shipped["@context"])
    terms.update(IRIS_1_1)
    return json.dumps({"@context": terms}).encode()


def seed_cache(cache: Path) -> None:
    """Store the 1.1 context in the validator's HTTP cache at ``cache``, as if fetched."""
    import requests
    from requests_cache import CachedSession
    from urllib3 import HTTPResponse

    body = context_1_1()
    session = CachedSession(cache_name=str(cache), backend="sqlite", expire_after=-1)
    try:
        request = requests.Request(
            "GET",
            CONTEXT_URL,
            headers={"Accept": "application/ld+json, application/json, */*;q=0.1"},
        ).prepare()
        response = requests.Response()
        response.status_code = 200
        response.url = CONTEXT_URL
        response.request = request
        response.encoding = "utf-8"
        response.headers["Content-Type"] = "application/ld+json"
        response._content = body  # what requests keeps once a body is read
        response.raw = HTTPResponse(
            body=io.BytesIO(body),
            headers={"Content-Type": "application/ld+json"},
            status=200,
            preload_content=False,
            request_url=CONTEXT_URL,
        )
        session.cache.save_response(response)
    finally:
        session.close()  # type: ignore[no-untyped-call]  # requests-cache leaves it untyped


def validate(crate: str, cache: Path) -> dict[str, object]:
    """Validate ``crate`` against Provenance Run Crate 0.5, REQUIRED level, offline."""
    from rocrate_validator import models, services

    settings = services.ValidationSettings(
        rocrate_uri=crate,
        profile_identifier="provenance-run-crate-0.5",
        requirement_severity=models.Severity.REQUIRED,
        offline=True,
        cache_path=cache,
    )
    result = services.validate(settings)
    issues = [
        [
            str(issue.severity.name),
            issue.check.identifier if issue.check else None,
            issue.message,
            str(getattr(issue, "violatingEntity", None)),
        ]
        for issue in result.get_issues()
    ]
    return {"passed": bool(result.passed()), "issues": issues}


if __name__ == "__main__":
    cache = Path(sys.argv[1])
    seed_cache(cache)
    print(json.dumps({crate: validate(crate, cache) for crate in sys.argv[2:]}))
