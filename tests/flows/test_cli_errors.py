"""User errors and bugs leave the CLI differently: a user error is one sentence and exit 2; any other
exception, a ValueError included, is a bug and keeps its traceback (flows/cli.py ``main``)."""

import subprocess
import sys

from tests.tasks.train.token_corpus import make_corpus

# A command that fails the way a bug does (an internal invariant raising ValueError), run through the real main().
BUGGY_COMMAND = """
import sys
from flows import cli

@cli.app.command("broken")
def broken() -> None:
    raise ValueError("an internal invariant broke")

sys.argv = ["smelt", "broken"]
cli.main()
"""


def test_a_user_error_is_one_sentence_and_exit_2(tmp_path):
    url = make_corpus(f"file://{tmp_path}/tokens")
    # 3 processes cannot hold tp=2: the layout check (tasks/train/parallel_dims.py) raises a UserError.
    result = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--data", url, "--nproc", "3", "--dry-run",
                             "--set", "train.parallel.tp=2"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr
    assert "on 3 rank(s)" in result.stderr and "parallel.tp" not in result.stdout


def test_an_internal_value_error_keeps_its_traceback():
    result = subprocess.run([sys.executable, "-c", BUGGY_COMMAND], capture_output=True, text=True, timeout=120)
    assert result.returncode not in (0, 2), result.stderr
    assert "Traceback" in result.stderr and "an internal invariant broke" in result.stderr, result.stderr
