import pytest

from tasks.config import ConfigError, from_dict
from tasks.dedup.config import DedupConfig


def test_defaults_are_the_published_ones():
    cfg = DedupConfig()
    assert (cfg.threshold, cfg.ngram, cfg.num_perm, cfg.scheme, cfg.verify) == (0.8, 5, 128, "affine32", "jaccard")


@pytest.mark.parametrize(
    "data, message",
    [
        ({"bands": 10}, "set both dedup.bands and dedup.rows"),
        ({"bands": 20, "rows": 8}, "at most dedup.num_perm"),
        ({"scheme": "md5"}, "dedup.scheme must be one of"),
        ({"verify": "maybe"}, "dedup.verify must be one of"),
        ({"threshold": 1.5}, "dedup.threshold must be in"),
        ({"thresold": 0.7}, "unknown config key 'thresold'"),
    ],
)
def test_mistakes_are_one_clear_error(data, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(DedupConfig, data)
