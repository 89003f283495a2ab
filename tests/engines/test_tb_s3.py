"""TensorBoard event files written straight to S3 (a SeaweedFS gateway on 127.0.0.1) read back with
TensorBoard's own reader."""

from __future__ import annotations

import fsspec
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tasks.tb_events import EventWriter
from tests.engines.conftest import BUCKET

pytestmark = pytest.mark.slow


def test_event_files_on_s3_read_back_with_tensorboard(s3, tmp_path):
    url = f"s3://{BUCKET}/tb-test/run/tensorboard/train"
    writer = EventWriter(url, roll_records=3)
    for step in range(1, 8):
        writer.scalars({"train/loss": 1.0 / step}, step)
        writer.flush()
    writer.close()
    fs = fsspec.filesystem("s3")
    objects = sorted(fs.find(url))
    assert len(objects) == 3 and all("tfevents" in o for o in objects)
    fs.get(objects, str(tmp_path) + "/")
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(s, pytest.approx(1.0 / s)) for s in range(1, 8)]
