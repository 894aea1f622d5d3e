"""DSL and runtime layers: a declaration of the user's own named on the command line
(``module:attribute``, ``path/to/file.py:attribute``), ``emit --shape``, and the errors a wrong name
or a configuration past the kernels' limits gets (no GPU: the CPU backend)."""

from __future__ import annotations

from pathlib import Path

import pytest

from replayssm_dsl import variants
from replayssm_dsl.errors import DeclarationError
from replayssm_dsl.runtime import cli

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "custom_variant.py")
OWN = f"{EXAMPLE}:gated_delta_with_gate"


def test_a_module_attribute_names_the_same_declaration_as_the_built_in():
    assert variants.get("replayssm_dsl.variants:gated_deltanet").fingerprint == variants.get("gdn").fingerprint


def test_check_decodes_a_declaration_from_a_file_against_the_oracle(capsys):
    status = cli.main(["check", OWN, "--backend", "cpu", "--steps", "24", "--window", "4", "--max-drafts", "3"])
    text = capsys.readouterr().out
    assert status == 0, text
    assert text.startswith("check gated_delta_gate on cpu") and "(ok," in text


def test_emit_writes_a_declaration_of_ones_own_at_a_shape(tmp_path, capsys):
    status = cli.main(["emit", OWN, "--shape", "4,2,32,64", "--window", "8", "--max-drafts", "4", "-o", str(tmp_path)])
    assert status == 0, capsys.readouterr()
    whole = tmp_path / "gated_delta_gate-4x2x32x64.cu"
    assert whole.is_file() and "replay_step" in whole.read_text()
    assert (tmp_path / "gated_delta_gate-4x2x32x64-verify.cu").is_file()


def test_emit_without_a_shape_says_so_and_its_help_claims_no_default(tmp_path, capsys):
    """``emit`` has no default shape (``check`` and ``show`` do): its help says --shape or --preset."""
    assert cli.main(["emit", "gdn", "-o", str(tmp_path)]) == 2
    assert "give the shape as --preset or --shape" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["emit", "--help"])
    text = capsys.readouterr().out
    assert "HV,H,V,K (this or --preset)" in text and "default 4,2,64,64" not in text

@pytest.mark.parametrize("name, message", [
    ("no_such_module_here:x", "no module 'no_such_module_here'"),
    ("examples/no_such_file.py:x", "no file examples/no_such_file.py"),
    (f"{EXAMPLE}:nope", "has no attribute 'nope'"),
    ("json:dumps", "needs arguments"),
    ("json:JSONDecoder", "is a type, not a Declaration"),
    ("sys:exit", "is a builtin_function_or_method, not a Declaration"),
    (":gdn", "name a declaration as module:attribute"),
    ("gnd", "unknown 'gnd'; built-in: mamba2"),
])
def test_a_name_that_is_no_declaration_is_refused_naming_it(name, message, capsys):
    with pytest.raises(DeclarationError, match="variant: "):
        variants.get(name)
    assert cli.main(["show", name]) == 2
    err = capsys.readouterr().err
    assert err.startswith("replayssm: error: variant:") and message in err, err


@pytest.mark.parametrize("argv, message", [
    (["emit", "gdn", "-o", "unused"], "give the shape as --preset or --shape"),
    (["emit", "gdn", "--preset", "qwen3.5-4b", "--shape", "4,2,8,8", "-o", "unused"], "one of them"),
    (["check", "gdn", "--backend", "cpu", "--window", "24"], "window + max_drafts = 32 > 31"),
])
def test_usage_the_kernels_cannot_serve_is_an_error_naming_the_option(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_file_whose_code_fails_is_reported_as_the_variant_and_not_kept(tmp_path, capsys):
    import sys
    broken = tmp_path / "broken_variant.py"
    broken.write_text("import a_module_that_is_not_there\n")
    assert cli.main(["show", f"{broken}:x"]) == 2
    err = capsys.readouterr().err
    assert "raised ModuleNotFoundError: No module named 'a_module_that_is_not_there'" in err, err
    assert not [name for name in sys.modules if name.startswith("replayssm_user_broken_variant")]


def test_two_files_of_one_name_load_as_two_modules(tmp_path):
    for folder, name in (("a", "gdn"), ("b", "mamba2")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "mine.py").write_text(
            f"from replayssm_dsl import variants\nDECL = variants.get({name!r})\n")
    a, b = (variants.get(f"{tmp_path / folder / 'mine.py'}:DECL") for folder in "ab")
    assert (a.name, b.name) == (variants.get("gdn").name, variants.get("mamba2").name)


@pytest.mark.parametrize("token_dtype, noted", [("float32", True), ("bfloat16", False)])
def test_a_record_dtype_that_changes_nothing_is_noted(token_dtype, noted, capsys):
    assert cli.main(["traffic", "--preset", "qwen3.5-4b", "--record-dtype", "bfloat16", "--token-dtype", token_dtype]) == 0
    err = capsys.readouterr().err
    assert ("--record-dtype bfloat16 changes nothing for gdn" in err) == noted, err
    assert ("add --token-dtype bfloat16" in err) == noted
