# The two commands of the README. Each installs what it needs first (scripts/setup.sh, idempotent).
PYTHON ?= python3

.PHONY: setup train test test-fast

setup:
	PYTHON=$(PYTHON) bash scripts/setup.sh

# Main job: the tic-tac-toe recipe (teacher data -> SFT -> RL -> exact eval + report) on the packaged model.
# TEACHER=none: from rewards alone (a random-cell format cold start, then RL on the solver's score of each sampled move).
TEACHER ?= solver
train: setup
	$(PYTHON) -m ludic recipe tictactoe --teacher $(TEACHER) $(ARGS)

# Full suite: unit, end-to-end (tiny model) and integration (a real vLLM CPU server).
test: setup
	$(PYTHON) -m pytest -q -ra --durations=40

test-fast: setup
	$(PYTHON) -m pytest -q -m "not integration and not slow"
