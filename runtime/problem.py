"""Problems: one primitive call's description, whose config string keys invokers and the find-db.

A config string is ``<primitive>,<key>=<value>,...`` with the keys in a fixed order, e.g.
``activ,dir=fwd,mode=relu,type=fp32,shape=2x3x4x5,xs=60x20x5x1,ys=60x20x5x1,a=0,b=0,g=0``;
a convolution's is MIOpen's key instead (``64-56-56-3x3-64-56-56-32-1x1-1x1-1x1-0-NCHW-FP32-F``).
It parses back to the same problem (:func:`parse_config`), so a find-db record, a log line or
a driver command (``--config``) names exactly one problem.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from kdbkit.runtime.errors import ProblemError

if TYPE_CHECKING:
    from kdbkit.runtime.tensor import TensorDesc


class Problem(ABC):
    """A primitive's problem. Subclasses are frozen dataclasses with a ``primitive`` name."""

    primitive: ClassVar[str]
    _kinds: ClassVar[dict[str, type["Problem"]]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if getattr(cls, "primitive", None):
            Problem._kinds[cls.primitive] = cls

    @abstractmethod
    def fields(self) -> list[tuple[str, str]]:
        """The config string's ``key=value`` pairs, in their fixed order."""

    @abstractmethod
    def tensors(self) -> dict[str, "TensorDesc"]:
        """Every tensor the problem's invokers take, by the keyword they take it as."""

    @classmethod
    @abstractmethod
    def from_fields(cls, fields: dict[str, str]) -> "Problem":
        """The problem these fields describe (every key of :meth:`fields` present)."""

    def config(self) -> str:
        # Kept on the (immutable) problem: every call asks for it several times (choice and
        # invoker caches, numerics checks), and building it was a fair share of a call's cost.
        try:
            return self.__dict__["_config"]
        except KeyError:
            text = ",".join([self.primitive, *(f"{k}={v}" for k, v in self.fields())])
            object.__setattr__(self, "_config", text)
            return text

    def __str__(self) -> str:
        return self.config()


def parse_config(text: str) -> Problem:
    """The problem a config string names.

    Raises:
        ProblemError: an unknown primitive, a malformed pair, a missing or unknown key.
    """
    from kdbkit.runtime.primitives import load_all, load_own  # each primitive registers its problem kind

    load_own()
    if not isinstance(text, str):
        raise ProblemError(f"a config string must be text, not {type(text).__name__}", "pass the config string")
    if text.strip()[:1].isdigit():  # a convolution: MIOpen's key, which names no primitive
        return _parsed(lambda: Problem._kinds["conv"].parse_key(text), text)  # type: ignore[attr-defined]
    primitive, _, rest = text.strip().partition(",")
    kind = Problem._kinds.get(primitive)
    if kind is None:  # an added primitive's: only now are the installed packages' entry points read
        load_all()
        kind = Problem._kinds.get(primitive)
    if kind is None:
        known = ", ".join(sorted(Problem._kinds)) or "none loaded"
        raise ProblemError(f"config string {text!r} names no known primitive ({primitive!r})",
                           f"start it with one of: {known}")
    fields: dict[str, str] = {}
    for pair in filter(None, rest.split(",")):
        key, sep, value = pair.partition("=")
        if not sep or not key or key in fields:
            raise ProblemError(f"config string {text!r}: {pair!r} is not a new key=value pair",
                               "write it as key=value, each key once")
        fields[key] = value
    problem = _from_fields(kind, fields, text)
    unknown = set(fields) - {k for k, _ in problem.fields()}
    if unknown:
        raise ProblemError(f"config string {text!r}: unknown keys {', '.join(sorted(unknown))}",
                           f"a {primitive} config has: {', '.join(k for k, _ in problem.fields())}")
    return problem


def _from_fields(kind: type[Problem], fields: dict[str, str], text: str) -> Problem:
    return _parsed(lambda: kind.from_fields(fields), text)


def _parsed(parse, text: str) -> Problem:
    """``parse()``, with any error a primitive's parser lets through (a value its checks did
    not foresee) turned into the ProblemError that names the config string."""
    try:
        return parse()
    except ProblemError:
        raise
    except (ValueError, TypeError, ArithmeticError, KeyError, IndexError) as exc:
        raise ProblemError(f"config string {text[:200]!r} does not describe a problem ({type(exc).__name__}: "
                           f"{str(exc)[:200]})", "check it against `kdb driver --help`") from None


def require(fields: dict[str, str], key: str, text_for_errors: str) -> str:
    """``fields[key]``, or a ProblemError naming the missing key."""
    if key not in fields:
        raise ProblemError(f"config {text_for_errors!r} has no {key}=", f"add {key}=<value>")
    return fields[key]


def parse_float(value: str, key: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ProblemError(f"{key}={value!r} is not a number", f"write {key} as a decimal number") from None
