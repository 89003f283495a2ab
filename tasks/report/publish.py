"""Write a run's report page and derived TensorBoard scalars into its folder (or where asked)."""

from __future__ import annotations

from tasks import storage
from tasks.report.collect import collect
from tasks.report.page import render
from tasks.report.scalars import write_scalars

REPORT = "report.html"


def write_report(run_dir: str, output: str | None = None, root: str | None = None) -> dict:
    """Render ``run_dir``'s report to ``output`` (default ``<run_dir>/report.html``) and rewrite its derived
    scalars; returns ``{"url", "tensorboard", "sections"}``."""
    data = collect(run_dir, root)
    page = render(data)
    url = storage.normalize_url(output) if output else storage.join(data["run_dir"], REPORT)
    with storage.atomic_write(url, "w") as f:
        f.write(page)
    return {"url": url, "tensorboard": write_scalars(data), "bytes": len(page.encode())}
