"""sparkserve-bench: measure an OpenAI-compatible engine and qualify it against a reference.

The controller-side benchmark of sparkserve (issue 10). ``run`` streams
requests to a served model and writes a results JSON; ``compare`` checks a
candidate results file against a reference (another results file, or the
published figures of a recipe's ``bench.reference``) with gates; ``report``
prints a results file and draws it. See bench/README.md.
"""

VERSION = "0.1.0"
RESULTS_FORMAT = "sparkserve-bench/results/1"
COMPARISON_FORMAT = "sparkserve-bench/comparison/1"
