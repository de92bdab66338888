"""ProgramRequest and the one key function: normalised options, every input keyed, layout pinned."""

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdbkit.kdb import KdbError, Target
from kdbkit.runtime.errors import OptionsError
from kdbkit.runtime.program_key import ProgramRequest, normalise_options, program_key

REQUEST = ProgramRequest("softmax.c", ("-DN=4",))
BASE = dict(target=Target("cuda", "sm_90"), source_digest="ab" * 32, compiler="nvrtc 13.0")


def test_options_are_order_independent_and_deduplicated():
    a = normalise_options("-DB=2 -DA=1 -D A=1 -O3")
    b = normalise_options(["-O3", "-DA=1", "-DB=2"])
    assert a == b == ("-DA=1", "-DB=2", "-O3")
    assert normalise_options("-DFLAG") == normalise_options("-DFLAG=1")


@pytest.mark.parametrize("bad", ["-DA=1 -DA=2", "-D", "-D=3", "-D1X=2", "-D =3", ["-D", ""], ["-D"], "-D 'unbalanced"])
def test_contradictory_or_malformed_options_are_refused_as_kdbkit_errors(bad):
    with pytest.raises(OptionsError) as info:
        normalise_options(bad)
    assert isinstance(info.value, KdbError) and info.value.remedy  # one line with the remedy in the CLI


def test_a_request_normalises_its_options():
    assert ProgramRequest("k.c", ["-DB=2", "-D", "A=1"]) == ProgramRequest("k.c", "-DA=1 -DB=2")
    assert str(ProgramRequest("k.c", "-DB=2 -DA")) == "k.c [-DA=1 -DB=2]"
    with pytest.raises(OptionsError):
        ProgramRequest("k.c", "-DA=1 -DA=2")


def test_key_is_readable_and_miopen_shaped():
    key = program_key(REQUEST, **BASE)
    assert key.kernel_name == "softmax.c.o"
    assert key.kernel_args.startswith("-DN=4 -mcpu=sm_90 --kdb-key=")


@pytest.mark.parametrize("change", [
    {"request": ProgramRequest("other.c", ("-DN=4",))}, {"request": ProgramRequest("softmax.c", ("-DN=8",))},
    {"target": Target("cuda", "sm_80")}, {"target": Target("hip", "gfx90a", ("xnack-",))},
    {"source_digest": "cd" * 32}, {"compiler": "nvrtc 13.1"},
    {"compiler": "nvrtc 13.0 + cuda-runtime headers 13.5.37"},  # the header folder handed to NVRTC
])
def test_every_input_changes_the_key(change):
    args = {"request": REQUEST, **BASE, **change}
    assert program_key(args.pop("request"), **args).kernel_args != program_key(REQUEST, **BASE).kernel_args


def test_the_cu_count_is_not_keyed():
    # Binaries depend on the arch; only options that mention the CU count change them.
    assert program_key(REQUEST, **{**BASE, "target": Target("cuda", "sm_90", (), 132)}) == program_key(REQUEST, **BASE)


def test_fields_cannot_bleed_into_each_other():
    a = program_key(ProgramRequest("k.c", ("-DA=1", "-DB=2")), **BASE)
    b = program_key(ProgramRequest("k.c", ("-DA=1\0-DB=2",)), **BASE)
    assert a.digest != b.digest or a.kernel_args != b.kernel_args


@pytest.mark.parametrize("field", ["compiler", "source_digest"])
def test_unobserved_inputs_are_refused(field):
    with pytest.raises(ValueError, match="must be observed"):
        program_key(REQUEST, **{**BASE, field: ""})


def test_key_layout_is_stable_so_shipped_bundles_keep_matching():
    # Key schema 2 (request-based; compiler identity with its header folders). A faster
    # implementation must give the same bytes, or every installed bundle would miss.
    key = program_key(ProgramRequest("softmax.c", ("-DTILE=16", "-DKDB_DTYPE=float")),
                      target=Target("hip", "gfx90a", ("xnack-",)), source_digest="ab" * 32, compiler="nvrtc 13.0")
    # (Checked when pinned against SHA-256 fed the length-prefixed fields one by one.)
    assert key.digest == "38ca614d60758701db346c7a9c578798e6b5b3fc901eb39175baf1b7e7b20f09"


def test_normalising_is_remembered_but_lists_and_errors_still_work():
    opts = ["-DB=2", "-DA=1"]
    assert normalise_options(opts) == normalise_options(tuple(opts)) == ("-DA=1", "-DB=2")
    opts.append("-DA=3")  # the caller's list changes: its new value is normalised, not a stale one
    for _ in range(2):  # a refused input is refused every time, not remembered as a result
        with pytest.raises(OptionsError):
            normalise_options(opts)


def _outcome(options):
    try:
        return normalise_options(options)
    except (OptionsError, ValueError) as exc:
        return type(exc)


_DEFINES = st.builds("-D{}={}".format, st.text(alphabet="AB_1", max_size=3), st.text(alphabet="1= \n\0\t\\é", max_size=3))


@given(st.lists(st.one_of(_DEFINES, st.sampled_from(["-DA", "-D", "-O3", "", " "])), max_size=4), st.booleans())
@settings(max_examples=600, deadline=None)
def test_options_already_in_normal_form_are_kept_as_normalising_writes_them(tokens, in_order):
    # The fast path (sorted defines with distinct names kept as they are) must never change a key:
    # a string of the same options always takes the full path.
    if in_order:
        tokens = sorted(tokens)
    assert _outcome(tuple(tokens)) == _outcome(shlex.join(tokens))


@given(st.text(alphabet=st.sampled_from(list("AB=1-D_ \t\n\r\x0b\x0c\x1c\x1f'\"\\#é\u2003")), max_size=16))
@settings(max_examples=400, deadline=None)
def test_a_string_of_options_splits_as_shlex_splits_it(text):
    # The fast split (str.split where it agrees with shlex) must never change a key.
    try:
        tokens = shlex.split(text)
    except ValueError:
        assert _outcome(text) is OptionsError  # an unbalanced quote or a lone escape
        return
    assert _outcome(text) == _outcome(tokens)


@pytest.mark.parametrize("request_, target", [
    (REQUEST, Target("cuda", "sm_90")),
    (ProgramRequest("activ.c"), Target("opencl", "ocl-3f9a1c2b7d10")),  # no options
    (ProgramRequest("lib/k.c", "-DB=2 -DA=1 -O3"), Target("hip", "gfx90a", ("xnack-",), 110)),
])
def test_a_key_s_readable_part_parses_back_into_its_inputs(request_, target):
    from kdbkit.runtime.program_key import parse_key

    key = program_key(request_, **{**BASE, "target": target})
    parsed = parse_key(key.kernel_name, key.kernel_args)
    assert parsed == (request_.kernel_file, request_.options, target.full_arch)
    # ...so that the key can be computed again from a row: what `kdb cache export` checks
    assert program_key(ProgramRequest(parsed.kernel_file, parsed.options), **{**BASE, "target": target}) == key


@pytest.mark.parametrize("name, args", [
    ("softmax.c", "-mcpu=sm_90 --kdb-key=" + "0" * 32),  # no ".o"
    (".o", "-mcpu=sm_90 --kdb-key=" + "0" * 32),  # no file
    ("softmax.c.o", "-DN=4 -mcpu=sm_90"),  # no digest
    ("softmax.c.o", "-DN=4 -mcpu=sm_90 --kdb-key=" + "0" * 31),  # a digest cut short
    ("softmax.c.o", "-DN=4-mcpu=sm_90 --kdb-key=" + "0" * 32),  # glued to the options
    ("softmax.c.o", "-mcpu=gfx90a -O3 -DN=4"),  # MIOpen's own rows
    ("softmax.c.o", None),
])
def test_rows_not_laid_out_as_keys_do_not_parse(name, args):
    from kdbkit.runtime.program_key import parse_key

    assert parse_key(name, args) is None
