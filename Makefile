# The two commands of the README, and the steps they are made of.
SHELL := /bin/bash
export PATH := $(CURDIR)/.venv/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_FORCE_COLOR := 0
export PY_COLORS := 0
# Every stage of check and test adds its wall time here; both print it at the end.
export SPARKSERVE_TIMETABLE := $(CURDIR)/.cache/timetable.tsv

LAB_NODES ?= 2
TIMED := python3 tools/timetable.py run
# pytest's workers: one per core (2 on CI's machine).
PYTEST_WORKERS ?= auto

.PHONY: demo test check chaos setup lab lab-destroy site docs pytest lint lint-yaml lint-ansible lint-python lint-prometheus \
	lint-sanity molecule molecule-default molecule-supervisor molecule-faults molecule-fleet molecule-cluster4 molecule-ring

## demo: set this machine up, bring up a 2-node lab, bring the deployment up
## on it with the sparkserve command (site.yml through ansible-runner, shown
## live), and ask it one real completion through the gateway, with the lab's key.
demo: setup lab
	SPARKSERVE_API_KEY="$$(cat .lab/gateway-key)" sparkserve up --ask "The capital of France is"

## test: the whole test suite (what CI runs), then the time table. After setup,
## pytest (one worker) and then the linters, which need no lab, run beside the
## scenarios of the two labs (molecule); their output is kept in
## .cache/static.log and shown after molecule's. The two labs are the longest
## path, so the linters (which wait on nothing) run at a lower priority and take
## the cores while the labs wait; pytest, whose tests of the doubles run on real
## time, does not. The table's total is the wall time.
test:
	@python3 tools/timetable.py reset
	@$(MAKE) --no-print-directory setup
	@{ $(MAKE) --no-print-directory pytest PYTEST_WORKERS=1; tests=$$?; \
	   nice -n 10 $(MAKE) --no-print-directory lint; test $$tests -eq 0 -a $$? -eq 0; } >.cache/static.log 2>&1 & static=$$!; \
	$(MAKE) --no-print-directory molecule; lab=$$?; \
	wait $$static; checks=$$?; \
	echo "--- pytest and the linters (.cache/static.log) ---"; cat .cache/static.log; \
	python3 tools/timetable.py print; \
	test $$lab -eq 0 -a $$checks -eq 0

## check: the fast tier for the inner loop: pytest (on every core) and, beside
## it, every linter; no lab. The linters' output is kept in .cache/lint.log and
## shown after pytest's.
check:
	@python3 tools/timetable.py reset
	@$(MAKE) --no-print-directory setup
	@$(MAKE) --no-print-directory lint >.cache/lint.log 2>&1 & lint=$$!; \
	$(MAKE) --no-print-directory pytest; tests=$$?; \
	wait $$lint; linters=$$?; \
	echo "--- the linters (.cache/lint.log) ---"; cat .cache/lint.log; \
	python3 tools/timetable.py print; \
	test $$tests -eq 0 -a $$linters -eq 0

## chaos: random faults at random moments of random operations on the lab
## (two deployments behind the gateway), every invariant after each round, a
## report (.cache/chaos-report.txt). ROUNDS rounds drawn from SEED; ROUND=K
## replays round K of SEED alone. Minutes a round: not part of test.
ROUNDS ?= 10
SEED ?= $(shell date +%s)
ROUND ?= 0
chaos: setup
	python3 tools/chaos.py --rounds $(ROUNDS) --seed $(SEED) --round $(ROUND)

setup:
	@$(TIMED) setup -- tools/setup-controller.sh

lab:
	ansible-playbook playbooks/lab.yml -e lab_nodes=$(LAB_NODES)

lab-destroy:
	ansible-playbook playbooks/lab-destroy.yml

site:
	ansible-playbook -i inventory/lab site.yml

## docs: write each role's README.md from its meta/argument_specs.yml and the comments of
## its defaults/main.yml, and recipes/README.md and recipes/recipe.schema.json from the
## recipe schema (pytest fails while one is stale; each tool's --check names it).
docs:
	python3 tools/role-docs.py
	python3 tools/recipe-docs.py

pytest:
	@$(TIMED) pytest -- python -m pytest -q -n $(PYTEST_WORKERS) tests

## lint: yamllint and ansible-lint (which also runs every playbook's syntax
## check), ruff, mypy on the plugins, the node programs and the bench, promtool
## on the alerts, and ansible-test sanity where it runs here (tools/sanity.sh).
lint: lint-yaml lint-ansible lint-python lint-prometheus lint-sanity

lint-yaml:
	@$(TIMED) yamllint -- yamllint --strict .

# ansible-lint as a contributor runs it (.ansible-lint: the production profile, offline); it syntax-checks every
# playbook too.
lint-ansible:
	@$(TIMED) ansible-lint -- ansible-lint

lint-python:
	@$(TIMED) ruff -- ruff check .
	@$(TIMED) mypy -- mypy

lint-sanity:
	@$(TIMED) "ansible-test sanity" -- tools/sanity.sh

## lint-prometheus: promtool checks the alert rules and runs the unit tests of
## tests/monitoring/*.test.yml (the rendered recording rules are pytest's).
lint-prometheus:
	@$(TIMED) promtool -- promtool check rules roles/monitoring/files/sparkserve.alerts.yml
	@$(TIMED) "promtool test" -- promtool test rules $(wildcard tests/monitoring/*.test.yml)

## molecule: two labs at once, on the two cores. On the first, default
## destroys what an earlier run left and creates the 2-node lab, supervisor
## runs the supervisor's faults on it, and fleet destroys it, brings up two
## deployments on 2 nodes, then one node, and destroys that; beside it, on
## the second lab (molecule/faults/vars/lab.yml), the faults scenario brings
## up its own 2-node lab and destroys it at the end, then cluster4 builds it
## with 4 nodes and destroys it (the two lanes take about as long). The images
## both labs use are built first, once. The second lab's output is kept in
## .cache/faults.log and shown after the first's.
molecule:
	@$(TIMED) "lab images" -- ansible-playbook playbooks/lab.yml --tags lab-images
	@$(MAKE) --no-print-directory molecule-faults molecule-cluster4 >.cache/faults.log 2>&1 & faults=$$!; \
	$(MAKE) --no-print-directory molecule-default molecule-supervisor molecule-fleet; lab=$$?; \
	wait $$faults; faulty=$$?; \
	echo "--- the faults and cluster4 scenarios, on the second lab (.cache/faults.log) ---"; cat .cache/faults.log; \
	test $$lab -eq 0 -a $$faulty -eq 0

molecule-default:
	@$(TIMED) "molecule default" -- molecule test -s default

molecule-faults:
	@$(TIMED) "molecule faults" -- molecule test -s faults

molecule-supervisor:
	@$(TIMED) "molecule supervisor" -- molecule test -s supervisor

# Several deployments on a 2-node lab, then a one-node lab (LAB_NODES=1).
# Its create must always rewrite the lab's cluster file, so its state is reset.
molecule-fleet:
	@molecule reset -s fleet >/dev/null 2>&1 || true
	@$(TIMED) "molecule fleet" -- molecule test -s fleet

# Three nodes cabled in a ring (one network per half of each link), serving
# lab-tp3; not part of make test (its own lab, rebuilt, does not fit the
# budget). Its create must always build the ring, so its state is reset.
molecule-ring:
	@molecule reset -s ring >/dev/null 2>&1 || true
	@$(TIMED) "molecule ring" -- molecule test -s ring

# molecule skips a create its own state says was done; cluster4's create must
# always build the second lab with four nodes, so its state is reset first.
molecule-cluster4:
	@molecule reset -s cluster4 >/dev/null 2>&1 || true
	@$(TIMED) "molecule cluster4" -- molecule test -s cluster4
