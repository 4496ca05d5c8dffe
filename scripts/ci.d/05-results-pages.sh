#!/usr/bin/env bash
# Issue 40 item 14: every figure a results page states is found in the
# records stored beside it (docs/results/NAME/), at the precision shown; a
# figure worked out by hand or quoted from a run whose output was not kept
# fails the step (history of that kind sits under a heading saying
# "(records not kept)"). A few seconds; no build.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 scripts/check-results-pages.py
