"""Every numeric input a user gives specrt is checked here, once: type, finiteness, range.

Why one module: a value that is not a meaningful number (NaN, inf, a negative count, 3.7 for
a token count, `true` for a window) must never turn into a plausible-looking wrong image.
The CLI, the Python API (Pipeline.generate) and the C API (params_json) all pass their values
through these functions, so each rule is written once and every message has the same shape:
one line naming the value and the allowed range, raised as SpecrtError (CLI: exit 2; C API:
SPECRT_ERR_INVALID_ARGUMENT):

    cool-sd relaxation_budget must be a finite number >= 1, got nan
    --top-p must be a number in (0, 1], got 1.5

Use it for any new numeric option or method parameter:

    from specrt.validation import Float, Int, integer, number
    top_p = number("--top-p", value, low=0, high=1, low_open=True)
    PARAMS = {"draft_len": Int(4, low=1, symbol="L")}   # a method's parameters

Strings are accepted where they spell a value exactly ("4", "0.5", "true"), since CLI
`--param key=value` and config files hand strings in; bools are never numbers and numbers
are never bools. Pure Python (no numpy, no torch) so every layer can import it; torch_device
imports torch lazily, only to ask it about a CUDA device.
"""
from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from specrt.errors import SpecrtError

# Seeds are 64-bit unsigned in the C API (and numpy's generators accept any such value).
SEED_MAX = 2**64 - 1
# Upper bound for counts a user gives (windows, tree sizes, batch sizes): far beyond any bundle,
# small enough that arithmetic on it cannot overflow int32 buffers.
COUNT_MAX = 1 << 20

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _range_text(low: Optional[float], high: Optional[float], low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{_fmt(low)}, {_fmt(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {_fmt(low)}"
    if high is not None:
        return f"{'<' if high_open else '<='} {_fmt(high)}"
    return ""


def _fmt(x: float) -> str:
    if isinstance(x, int):
        return str(x)
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _fail(name: str, what: str, value: Any) -> SpecrtError:
    return SpecrtError(f"{name} must be {what}, got {_shown(value)}")


def _in_range(x: float, low: Optional[float], high: Optional[float], low_open: bool, high_open: bool) -> bool:
    if low is not None and (x <= low if low_open else x < low):
        return False
    return not (high is not None and (x >= high if high_open else x > high))


def integer(name: str, value: Any, low: Optional[int] = None, high: Optional[int] = None,
            strings: bool = True) -> int:
    """`value` as an int in [low, high]; rejects bools, fractions, NaN/inf and non-numbers
    (and strings with strings=False: a JSON file's numbers must be numbers)."""
    what = " ".join(filter(None, ("an integer", _range_text(low, high, False, False))))
    if isinstance(value, bool) or value is None or (isinstance(value, str) and not strings):
        raise _fail(name, what, value)
    if isinstance(value, str):
        text = value.strip()
        try:
            result = int(text)
        except ValueError:
            raise _fail(name, what, value) from None
    elif isinstance(value, numbers.Integral):
        result = int(value)
    elif isinstance(value, numbers.Real) and math.isfinite(float(value)) and float(value).is_integer():
        result = int(value)  # 4.0 from JSON is the integer 4; 4.5 is not
    else:
        raise _fail(name, what, value)
    if not _in_range(result, low, high, False, False):
        raise _fail(name, what, value)
    return result


def number(name: str, value: Any, low: Optional[float] = None, high: Optional[float] = None,
           low_open: bool = False, high_open: bool = False) -> float:
    """`value` as a finite float in the range (open or closed ends); rejects bools, NaN, inf."""
    what = " ".join(filter(None, ("a finite number", _range_text(low, high, low_open, high_open))))
    if isinstance(value, bool) or value is None:
        raise _fail(name, what, value)
    if isinstance(value, str):
        try:
            result = float(value.strip())
        except ValueError:
            raise _fail(name, what, value) from None
    elif isinstance(value, numbers.Real):
        result = float(value)
    else:
        raise _fail(name, what, value)
    if not math.isfinite(result) or not _in_range(result, low, high, low_open, high_open):
        raise _fail(name, what, value)
    return result


def flag(name: str, value: Any) -> bool:
    """`value` as a bool: True/False or one of the strings true/false, yes/no, on/off, 1/0."""
    if isinstance(value, bool):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):  # numpy's bool
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise _fail(name, "true or false", value)


def json_object(name: str, text: Optional[str]) -> dict[str, Any]:
    """A JSON object given as text (keyword arguments from the C API or a server request); empty text is {}."""
    if not text or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecrtError(f"{name} is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(value, dict):
        raise SpecrtError(f"{name} must be a JSON object, got {type(value).__name__}")
    return value


def choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """`value` as one of the strings `choices`."""
    if isinstance(value, str) and value in choices:
        return value
    raise _fail(name, f"one of {', '.join(choices)}", value)


def seed(value: Any, name: str = "seed") -> int:
    """A random seed: an integer in [0, 2^64 − 1] (the C API's uint64_t)."""
    return integer(name, value, low=0, high=SEED_MAX)


def count(name: str, value: Any, low: int = 1, high: int = COUNT_MAX) -> int:
    """A size a user picks (batch size, window, tree width): an integer in [low, high]."""
    return integer(name, value, low=low, high=high)


def machine_cpus() -> int:
    """The CPUs this machine has (os.cpu_count(); 1 where it cannot tell)."""
    return max(1, os.cpu_count() or 1)


def threads(name: str, value: Any, zero_means_default: bool = False) -> int:
    """A CPU thread count: an integer in [1, the machine's CPUs] ([0, ...] where 0 means the library's default).

    Why a ceiling: each thread is an OS thread per model session, so `--threads 100000`
    started ~32,000 threads, printed nothing for minutes and left the machine unable to fork;
    more threads than CPUs never makes a step faster. Every thread count (CLI flags, the Python
    API, $SPECRT_THREADS of the C API, serving) goes through here so the limit and its message
    are the same everywhere."""
    limit = machine_cpus()
    low = 0 if zero_means_default else 1
    try:
        return integer(name, value, low=low, high=limit)
    except SpecrtError:
        what = f"an integer in [{low}, {limit}]" + (" (0: the library's default)" if zero_means_default else "")
        raise SpecrtError(f"{name} must be {what}: this machine has {limit} CPU(s), "
                          f"got {_shown(value)}") from None


def machine_memory() -> int:
    """Bytes of memory this process can still take: the kernel's MemAvailable, lowered to a cgroup's
    limit less its use where one is set (a container); physical memory where neither can be read."""
    available = None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    if available is None:
        try:
            available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return 1 << 62  # nothing to go by: no memory bound
    try:
        with open("/sys/fs/cgroup/memory.max") as limit, open("/sys/fs/cgroup/memory.current") as used:
            text = limit.read().strip()
            if text != "max":
                available = min(available, int(text) - int(used.read().strip()))
    except (OSError, ValueError):
        pass
    return max(0, available)


def within_memory(name: str, value: int, bytes_each: int, what: str) -> int:
    """`value` items of `bytes_each` bytes, refused in one line when they would take more than half
    of machine_memory(): checked before they are allocated, so a large count costs a second, not
    minutes of swapping and a kill by the kernel."""
    budget = machine_memory() // 2
    if value * bytes_each > budget:
        most = max(0, budget // max(1, bytes_each))
        raise SpecrtError(f"{name} {value}: {what} would take {value * bytes_each / 2**30:.1f} GiB, more than half "
                          f"the {2 * budget / 2**30:.1f} GiB this machine has free; at most {most} here")
    return value


TORCH_INSTALL = "https://pytorch.org/get-started/locally/"


def torch_device(value: Optional[str], name: str = "--device") -> Optional[str]:
    """A torch device the installed torch can use: cpu, cuda or cuda:N (None passes through).

    Checked before a model loads, against what torch reports (imported here, lazily: only a
    CUDA device needs it); a CPU-only torch or a missing GPU is one line naming the fix."""
    if value is None:
        return None
    text = str(value).strip().lower()
    kind, colon, index = text.partition(":")
    if kind not in ("cpu", "cuda") or (colon and (kind == "cpu" or not index.isdigit())):
        raise SpecrtError(f"{name} must be cpu, cuda or cuda:N, got {_shown(value)}")
    if kind == "cpu":
        return "cpu"
    from specrt.lazy import require

    torch = require("torch", f"{name} {text}")
    if not torch.cuda.is_available():
        if getattr(torch.version, "cuda", None) is None:
            raise SpecrtError(f"{name} {text}: the installed torch {torch.__version__} is a CPU-only build; install a "
                              f"CUDA build of torch ({TORCH_INSTALL}) on a machine with an NVIDIA GPU, or use {name} cpu")
        raise SpecrtError(f"{name} {text}: torch {torch.__version__} (CUDA {torch.version.cuda}) finds no GPU "
                          f"(check the driver, nvidia-smi and CUDA_VISIBLE_DEVICES), or use {name} cpu")
    count = torch.cuda.device_count()
    if index and int(index) >= count:
        raise SpecrtError(f"{name} {text}: this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}")
    return text


def class_ids(values: Any, num_classes: int, name: str = "class id") -> list[int]:
    """Class ids as ints in [0, num_classes − 1]; at least one."""
    items = [values] if isinstance(values, (str, numbers.Number)) or not hasattr(values, "__iter__") else list(values)
    if not items:
        raise SpecrtError("no class ids given")
    out = []
    for value in items:
        try:
            out.append(integer(name, value, low=0, high=num_classes - 1))
        except SpecrtError:
            raise SpecrtError(f"{name} {_shown(value)} out of range: this model has classes 0..{num_classes - 1} "
                              f"(an integer in [0, {num_classes - 1}])") from None
    return out


# ---- declarative parameters (decoding methods' PARAMS) ---------------------------------------


@dataclass(frozen=True)
class Param:
    """One method parameter: its default and the check `parse(name, value)` applies.

    `optional` lets None through (parameters whose absence means "use another one");
    `symbol` is the papers' name for it (δ, ν, K), shown in messages beside ours.
    """

    default: Any
    optional: bool = False
    symbol: str = ""

    def parse(self, name: str, value: Any) -> Any:
        if value is None and self.optional:
            return None
        return self.check(f"{name} ({self.symbol})" if self.symbol else name, value)

    def check(self, name: str, value: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Param):
    """An integer parameter in [low, high] (high defaults to COUNT_MAX)."""

    low: Optional[int] = None
    high: Optional[int] = COUNT_MAX

    def check(self, name: str, value: Any) -> int:
        return integer(name, value, low=self.low, high=self.high)


@dataclass(frozen=True)
class Float(Param):
    """A finite float parameter in a range with open or closed ends."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False

    def check(self, name: str, value: Any) -> float:
        return number(name, value, low=self.low, high=self.high, low_open=self.low_open, high_open=self.high_open)


@dataclass(frozen=True)
class Bool(Param):
    """A strict bool parameter (see flag)."""

    def check(self, name: str, value: Any) -> bool:
        return flag(name, value)


@dataclass(frozen=True)
class Choice(Param):
    """A string parameter from a fixed set."""

    choices: tuple[str, ...] = ()

    def check(self, name: str, value: Any) -> str:
        return choice(name, value, self.choices)
