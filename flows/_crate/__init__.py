"""Export a campaign as a Provenance Run Crate (``unattended export --format ro-crate``).

The crate holds the campaign's records, its W3C PROV graph and its offline report, so it
sits above both the provenance store (which it reads) and the report (which it embeds);
the store itself never imports it.
"""

from flows._crate._build import build_crate, write_crate

__all__ = ["build_crate", "write_crate"]
