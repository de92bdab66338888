import pytest

from kdbkit.runtime.program_key import OptionsError, normalise_options, program_key

BASE = dict(kernel_file="softmax.c", options=("-DN=4",), arch="sm_90", source_digest="ab" * 32, compiler="nvrtc 13.0")


def test_options_are_order_independent_and_deduplicated():
    a = normalise_options("-DB=2 -DA=1 -D A=1 -O3")
    b = normalise_options(["-O3", "-DA=1", "-DB=2"])
    assert a == b == ("-DA=1", "-DB=2", "-O3")
    assert normalise_options("-DFLAG") == normalise_options("-DFLAG=1")


@pytest.mark.parametrize("bad", ["-DA=1 -DA=2", "-D", "-D=3", "-D1X=2"])
def test_contradictory_or_malformed_options_are_refused(bad):
    with pytest.raises(OptionsError):
        normalise_options(bad)


def test_key_is_readable_and_miopen_shaped():
    key = program_key(**BASE)
    assert key.kernel_name == "softmax.c.o"
    assert key.kernel_args.startswith("-DN=4 -mcpu=sm_90 --kdb-key=")


@pytest.mark.parametrize("field,value", [
    ("kernel_file", "other.c"), ("options", ("-DN=8",)), ("arch", "sm_80"), ("arch", "gfx90a:xnack-"),
    ("source_digest", "cd" * 32), ("compiler", "nvrtc 13.1"),
])
def test_every_input_changes_the_key(field, value):
    assert program_key(**{**BASE, field: value}).kernel_args != program_key(**BASE).kernel_args


def test_fields_cannot_bleed_into_each_other():
    a = program_key(**{**BASE, "options": ("-DA=1", "-DB=2")})
    b = program_key(**{**BASE, "options": ("-DA=1\0-DB=2",)})
    assert a.digest != b.digest or a.kernel_args != b.kernel_args


@pytest.mark.parametrize("field", ["compiler", "source_digest", "arch"])
def test_unobserved_inputs_are_refused(field):
    with pytest.raises(ValueError, match="must be observed"):
        program_key(**{**BASE, field: ""})


def test_key_layout_is_stable_so_shipped_bundles_keep_matching():
    # Computed by kdbkit 0.1.0, which fed the fields to SHA-256 one by one; a faster
    # implementation must give the same bytes, or every installed bundle would miss.
    key = program_key(kernel_file="softmax.c", options=("-DKDB_DTYPE=float", "-DTILE=16"), arch="gfx90a:xnack-",
                      source_digest="ab" * 32, compiler="nvrtc 13.0")
    assert key.digest == "9962a85eed37526497eaa54559d68d1bca7d1bec06478155d4623972031811e9"


def test_normalising_is_remembered_but_lists_and_errors_still_work():
    opts = ["-DB=2", "-DA=1"]
    assert normalise_options(opts) == normalise_options(tuple(opts)) == ("-DA=1", "-DB=2")
    opts.append("-DA=3")  # the caller's list changes: its new value is normalised, not a stale one
    for _ in range(2):  # a refused input is refused every time, not remembered as a result
        with pytest.raises(OptionsError):
            normalise_options(opts)
