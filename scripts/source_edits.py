"""Text edits of a generated CUDA module, for the measurement scripts (not part of the library):
an edit confined to one kernel's text, the replay step's exact replacements, and the exception an
edit raises where a family's source has nothing for it to change.

``experiment_variants.py`` builds its variants from these; ``variant_tests.py`` runs the GPU tests
with them (an edit that raises ``NotApplicable`` leaves that module unedited there).
"""

from __future__ import annotations


class NotApplicable(Exception):
    """A variant's edit finds nothing to change in this family's source (its row prints n/a)."""


def in_kernel(name: str, edit):
    """``edit`` applied to kernel ``name``'s text only (from its signature to the next kernel's)."""
    def apply(source: str) -> str:
        start = source.index(f") {name}(")
        end = source.find("extern \"C\" __global__", start)
        end = len(source) if end < 0 else end
        return source[:start] + edit(source[start:end]) + source[end:]
    return apply


def replay_step_edits(edits):
    """``(old, new)`` edits applied to the replay step's text only, each exactly once."""
    def edit(text: str) -> str:
        for old, new in edits:
            if text.count(old) != 1:
                raise SystemExit(f"variant edit does not apply once to replay_step: {old[:60]!r}")
            text = text.replace(old, new, 1)
        return text
    return in_kernel("replay_step", edit)
