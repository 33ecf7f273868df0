#!/usr/bin/env bash
# Build the documentation site into docs/_build/html, then run the guides' examples.
# Every warning is an error: a broken cross-reference, a public name without a docstring,
# a malformed docstring, a guide example that fails or prints something else.
set -euo pipefail
cd "$(dirname "$0")/.."
opts=(-W --keep-going -q -d docs/_build/doctrees)
python3 -m sphinx "${opts[@]}" -b html docs docs/_build/html
python3 -m sphinx "${opts[@]}" -b doctest docs docs/_build/doctest
echo "docs: docs/_build/html/index.html"
