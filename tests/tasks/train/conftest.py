"""Fixtures the trainer tests share: one OpenMP thread, and a small learnable tokens corpus per module."""

import pytest


@pytest.fixture
def one_thread():
    """Two OpenMP threads on two cores shared with other work are far slower than one."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """A tokens dataset (tests/tasks/train/token_corpus.py) written once per test module."""
    from tests.tasks.train.token_corpus import make_corpus

    return make_corpus(str(tmp_path_factory.mktemp("corpus")))
