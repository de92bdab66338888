"""Fuzzing the config-string parser: mutated and random text, and numbers of any size in any
field, give kdbkit errors (ProblemError), never another exception type (a 5,000-digit integer
in a convolution key once raised Python's ValueError). Bounded to run in seconds on CI."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdbkit.kdb import KdbError
from kdbkit.runtime.problem import parse_config

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

CONFIGS = [
    "activ,dir=fwd,mode=relu,type=fp32,shape=8,xs=1,ys=1,a=0.0,b=0.0,g=0.0",
    "2-4-4-3x3-2-4-4-1-1x1-1x1-1x1-0-NCHW-FP32-F",
    "gemm,type=fp32,m=16,n=16,k=16,ta=0,tb=0,batch=1,lda=16,ldb=16,ldc=16,sa=0,sb=0,sc=0,a=1.0,b=0.0",
    "layernorm,dir=fwd,type=fp32,shape=2x8,dim=1,affine=1,eps=1e-05",
    "pool,dir=fwd,mode=max,type=fp32,shape=1x1x4x4,win=2x2,stride=2x2,pad=0x0,xs=16x16x4x1,ys=4x4x2x1,idx=1",
    "softmax,dir=fwd,algo=accurate,mode=channel,type=fp32,shape=1x8x1x1,xs=8x8x1x1,ys=8x8x1x1,a=1.0,b=0.0",
    "bnorm,dir=infer,mode=spatial,type=fp32,shape=1x1x2x2,xs=4x4x2x1,ys=4x4x2x1,eps=1e-05,f=0.1,running=1,saved=1",
    "tensorop,op=add,type=fp32,shape=4,as=1,bshape=4,bs=1,cs=1,a1=1.0,a2=1.0,b=0.0",
]


def _parse(text: str) -> None:
    try:
        parse_config(text)
    except KdbError:
        pass


def test_the_configs_parse():
    assert [parse_config(c).config() for c in CONFIGS[1:]] == CONFIGS[1:]


# Pieces a mutation splices in: digits by the thousand, signs, separators, odd characters.
PIECES = st.sampled_from(["9" * 5000, "-1", "0", "x", ",", "=", "-", "1e999", "nan", "٣", "\x00", "NHWC", "FP16",
                          "99999999999999999999", str(2 ** 63), "0x10", " ", "=,=", "B", "W"])


@FUZZ
@given(which=st.integers(0, len(CONFIGS) - 1), cuts=st.lists(st.tuples(st.integers(0, 200), PIECES), max_size=4))
def test_mutated_config_strings_give_only_kdbkit_errors(which, cuts):
    text = CONFIGS[which]
    for at, piece in cuts:
        at %= len(text) + 1
        text = text[:at] + piece + text[at + 1:]
    _parse(text)


@FUZZ
@given(text=st.text(max_size=300))
def test_random_config_strings_give_only_kdbkit_errors(text):
    _parse(text)


def _with_each_number_replaced(by: str) -> list[str]:
    return [config[:m.start()] + by + config[m.end():] for config in CONFIGS for m in re.finditer(r"\d+", config)]


@pytest.mark.parametrize("huge", ["9" * 5000, str(2 ** 63), "-" + "9" * 30])
def test_huge_numbers_in_any_field_give_only_kdbkit_errors(huge):
    """A 5,000-digit integer in a convolution key once raised Python's ValueError."""
    for text in _with_each_number_replaced(huge):
        _parse(text)
