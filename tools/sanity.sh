#!/usr/bin/env bash
# ansible-test sanity on the collection, where it can run here: ansible-test
# reads a collection from ansible_collections/NAMESPACE/NAME with its own files
# (collections/ links plugins/, which it does not follow), so the collection is
# copied into a temporary tree first. The tests listed need nothing but
# ansible-core; the others (ansible-doc, validate-modules, pylint, pep8, import,
# yamllint, runtime-metadata) make a virtual environment with pip's bootstrap
# script from the internet, which this machine does not reach.
set -euo pipefail
cd "$(dirname "$0")/.."
tests=(action-plugin-docs compile empty-init no-assert use-argspec-type-path shebang line-endings symlinks
       no-illegal-filenames no-smart-quotes replace-urlopen use-compat-six no-get-exception changelog)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
collection="$work/ansible_collections/sparkserve/deploy"
mkdir -p "$collection"
cp -r collections/ansible_collections/sparkserve/deploy/{galaxy.yml,meta,README.md,CHANGELOG.md} "$collection/"
cp -rL plugins "$collection/plugins"
find "$collection" -name __pycache__ -prune -exec rm -rf {} +
python=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
cd "$collection"
# ansible-test lists a collection's files with git when it is a repository.
git init -q . && git add -A
args=()
for test in "${tests[@]}"; do args+=(--test "$test"); done
ansible-test sanity --local --python "$python" "${args[@]}" 2>&1 | grep -v '^WARNING: .*locale\|^WARNING: Reviewing previous'
