"""kdbkit's errors cross process boundaries (a build's workers, a fresh compile process, a Dask
cluster) by pickling: each comes back as the same class with the same line and attributes."""

from __future__ import annotations

import pickle

import kdbkit
from kdbkit.kdb.errors import KdbError
from kdbkit.kdb.split import SplitError
from kdbkit.runtime.errors import CompileError, HandleClosedError


def _every_subclass(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_every_subclass(sub)]
    return found


def _round_trip(error: KdbError) -> KdbError:
    return pickle.loads(pickle.dumps(error))


def test_every_error_class_comes_back_with_the_same_line_and_parts():
    assert kdbkit  # every module's errors are defined once kdbkit is imported
    # kdbkit's own: a test module may define local ones, which pickle cannot find by name
    classes = [c for c in [KdbError, *_every_subclass(KdbError)] if c.__module__.startswith("kdbkit.")]
    assert len(classes) > 20
    for cls in classes:
        try:
            error = cls(f"the problem of {cls.__name__}", "the remedy")
        except TypeError:  # its own arguments (SplitError's program and sizes): its parts set as KdbError sets them
            error = cls.__new__(cls)
            KdbError.__init__(error, f"the problem of {cls.__name__}", "the remedy")
        back = _round_trip(error)
        assert type(back) is cls
        assert back.args == error.args == (f"the problem of {cls.__name__}; the remedy",), cls
        assert back.__dict__ == error.__dict__, cls


def test_an_error_made_from_its_own_arguments_comes_back():
    error = _round_trip(SplitError("gemm.c [-DKDB_TYPE_FP16]", 4096, 1000))  # unpickling called __init__ with one
    assert str(error).startswith("its largest program, gemm.c [-DKDB_TYPE_FP16], takes 4096 bytes")
    assert error.program == "gemm.c [-DKDB_TYPE_FP16]" and error.needed > 4096


def test_default_remedies_and_a_compile_log_are_not_repeated():
    compile_error = _round_trip(CompileError("x.c failed to compile for sm_90 with nvrtc: error", log="the log"))
    assert str(compile_error) == "x.c failed to compile for sm_90 with nvrtc: error; fix the source; the compiler's log follows\nthe log"
    assert compile_error.log == "the log"
    assert str(_round_trip(HandleClosedError())) == "the handle is closed; make a new one (kdbkit.Handle())"
