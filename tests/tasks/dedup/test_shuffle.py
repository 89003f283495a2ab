import numpy as np
import pytest

from tasks import storage
from tasks.dedup.shuffle import RECORD, read_bucket, write_partitioned


def test_each_bucket_reads_back_exactly_its_records_in_input_order():
    records = np.zeros(40, dtype=RECORD)
    records["key"] = np.arange(40, dtype=np.uint64) * 7919
    records["doc"] = np.arange(40)
    url = "memory://shuffle-test/records.shf"
    with storage.atomic_write(url) as f:
        write_partitioned(f, records, num_buckets=3)
    for bucket in range(3):
        expected = records[records["key"] % 3 == bucket]
        np.testing.assert_array_equal(read_bucket(url, bucket), expected)


def test_a_file_that_is_not_a_shuffle_file_is_refused():
    url = "memory://shuffle-test/other.bin"
    with storage.atomic_write(url) as f:
        f.write(b"not a shuffle file at all")
    with pytest.raises(ValueError, match="not a smelt shuffle file"):
        read_bucket(url, 0)
