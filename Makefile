# The two commands of the README, and the steps they are made of.
SHELL := /bin/bash
export PATH := $(CURDIR)/.venv/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_FORCE_COLOR := 0
export PY_COLORS := 0

LAB_NODES ?= 2
PLAYBOOKS := site.yml $(wildcard playbooks/*.yml)

.PHONY: demo test setup lab lab-destroy site pytest lint syntax molecule

## demo: set this machine up, bring up a 2-node lab, run site.yml on it.
demo: setup lab site

## test: the whole test suite (what CI runs).
test: setup pytest lint syntax molecule

setup:
	@tools/setup-controller.sh

lab:
	ansible-playbook playbooks/lab.yml -e lab_nodes=$(LAB_NODES)

lab-destroy:
	ansible-playbook playbooks/lab-destroy.yml

site:
	ansible-playbook -i inventory/lab site.yml

pytest:
	python -m pytest -q tests

lint:
	yamllint --strict .
	ansible-lint --offline --profile production

syntax:
	@for pb in $(PLAYBOOKS); do \
	  ansible-playbook --syntax-check -i inventory/example/hosts.yml "$$pb" >/dev/null || { echo "syntax: $$pb"; exit 1; }; \
	done; echo "syntax: $(words $(PLAYBOOKS)) playbooks ok"

molecule:
	molecule test -s default
	molecule test -s cluster4
	molecule test -s faults
