# The two commands of the README. Each installs what it needs first (scripts/setup.sh, idempotent).
PYTHON ?= python3

.PHONY: setup train test test-fast

setup:
	PYTHON=$(PYTHON) bash scripts/setup.sh

# Main job: the tic-tac-toe recipe on the packaged model, from rewards alone (a random-cell format cold start, then RL
# on the solver's score of each sampled move -> exact eval + report). TEACHER=solver: SFT on the solver's moves, then RL.
TEACHER ?= none
train: setup
	$(PYTHON) -m ludic recipe tictactoe --teacher $(TEACHER) $(ARGS)

# Full suite: unit, end-to-end (tiny model) and integration (a real vLLM CPU server).
test: setup
	$(PYTHON) -m pytest -q -ra --durations=40

test-fast: setup
	$(PYTHON) -m pytest -q -m "not integration and not slow"
