"""kdbkit's errors cross process boundaries (a build's workers, a fresh compile process, a Dask
cluster) by pickling: each comes back as the same class with the same line and attributes."""

from __future__ import annotations

import pickle

import kdbkit
from kdbkit.kdb.errors import KdbError
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
    classes = [KdbError, *_every_subclass(KdbError)]
    assert len(classes) > 20
    for cls in classes:
        error = cls(f"the problem of {cls.__name__}", "the remedy")
        back = _round_trip(error)
        assert type(back) is cls
        assert str(back) == str(error) == f"the problem of {cls.__name__}; the remedy", cls
        assert (back.problem, back.remedy) == (error.problem, error.remedy)


def test_default_remedies_and_a_compile_log_are_not_repeated():
    compile_error = _round_trip(CompileError("x.c failed to compile for sm_90 with nvrtc: error", log="the log"))
    assert str(compile_error) == "x.c failed to compile for sm_90 with nvrtc: error; fix the source; the compiler's log follows\nthe log"
    assert compile_error.log == "the log"
    assert str(_round_trip(HandleClosedError())) == "the handle is closed; make a new one (kdbkit.Handle())"
