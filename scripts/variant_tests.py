"""Run the GPU tests with one of ``experiment_variants.py``'s source edits in every generated module
it applies to (on the GPU machine), so a timed candidate is checked against the float64 oracle
before the code generator takes it.

The edits replace text of the generated source; where a variant does not apply to a module (another
family's kernels, a launch without the edited block) the module compiles unedited, and the run ends
by printing how many modules each way, so a variant that edited nothing cannot pass unnoticed.

Usage: ``python scripts/variant_tests.py "fold writes from shared" -- tests/test_gpu_kernels.py -k kda``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import experiment_variants  # noqa: E402  (the scripts' folder is on the path first)
import pytest  # noqa: E402

from replayssm_dsl.runtime import cuda_module  # noqa: E402


def edited_where_it_applies(edits, counts: dict):
    """A ``render_program`` that applies ``edits`` where they apply and renders unedited elsewhere."""
    edited, unedited = experiment_variants.patched_renderer(edits), experiment_variants.patched_renderer([])

    def render(program, launch, kernels=None):
        try:
            source = edited(program, launch, kernels)
            counts["edited"] += 1
        except (SystemExit, experiment_variants.NotApplicable):
            source = unedited(program, launch, kernels)
            counts["unedited"] += 1
        return source
    render.__wrapped__ = edited.__wrapped__
    return render


def main(argv: list[str]) -> int:
    if len(argv) < 1 or argv[0] not in experiment_variants.VARIANTS:
        print(__doc__.strip().splitlines()[-1], "\nvariants:", *sorted(experiment_variants.VARIANTS), sep="\n  ")
        return 2
    label, pytest_args = argv[0], [a for a in argv[1:] if a != "--"]
    counts = {"edited": 0, "unedited": 0}
    cuda_module.render_program = edited_where_it_applies(experiment_variants.VARIANTS[label], counts)
    rc = pytest.main(["-q", "-p", "no:cacheprovider", *pytest_args])
    print(f"{label}: {counts['edited']} modules compiled edited, {counts['unedited']} unedited")
    return int(rc) if counts["edited"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
