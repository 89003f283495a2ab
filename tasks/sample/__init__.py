"""The bundled sample crawl: a generated, deterministic WARC crawl with a ground-truth file.

``write_sample_crawl(url)`` writes about 1,200 pages of known categories (English prose, code,
exact and near duplicates, other languages, low quality, malformed records) so every stage can
be run and checked end to end without network access; ``load_ground_truth(url)`` reads back
what each page is.
"""

from tasks.sample.crawl import GROUND_TRUTH, load_ground_truth, write_sample_crawl

__all__ = ["GROUND_TRUTH", "load_ground_truth", "write_sample_crawl"]
