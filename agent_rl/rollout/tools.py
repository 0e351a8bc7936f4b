"""Tools the policy may call: a name, a JSON schema, an async function, limits and counters.

A `Tool` is a plain async Python function `fn(**arguments) -> str` (the text the model reads)
with an OpenAI/Hermes function schema. `invoke` is the one way the rollout calls a tool: it
checks the arguments against the schema, holds the tool's own concurrency limit, applies its
timeout and counts calls, errors and latency (`tool/<name>/...` metrics). What can happen:

- the arguments are wrong (unknown or missing keys, wrong JSON types): `ToolArgumentError`,
  the policy's mistake, shown to it as feedback and counted as `bad_args`;
- the tool raised `ToolInputError` (e.g. the calculator got `1/0`, the retriever refused a
  query), or an argument is not text that can be sent (a lone surrogate: JSON's "\\ud800"
  decodes to one, and no UTF-8 encoder takes it): also the policy's mistake, shown as
  feedback, counted as `rejected`;
- the tool failed (an outage, a timeout, any other exception): `ok=False`, counted as an
  `error` (a timeout also as `timeout`); the trainer's failed-search rule applies to it;
- `ToolFatalError` (e.g. the retriever refused our API key) is raised: every call would fail.

Built-ins: `search` (the retriever, `search_tool`) and `calculator` (safe arithmetic). MCP
servers add tools through `agent_rl.rollout.mcp_tools`. Standard library only.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import logging
import math
import operator
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

class ToolArgumentError(ValueError):
    """The call's arguments do not match the tool's schema (the policy's mistake)."""


class ToolInputError(ValueError):
    """The tool refused this input as such (the policy's mistake, not an outage)."""


class ToolFatalError(RuntimeError):
    """Every call to this tool would fail the same way (e.g. a refused API key): stop the run."""


@dataclass
class ToolStats:
    """Counters of one tool since it was made (the rollout reports differences per step)."""

    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    bad_args: int = 0
    rejected: int = 0
    seconds: float = 0.0

    def minus(self, before: "ToolStats") -> "ToolStats":
        return ToolStats(**{f.name: getattr(self, f.name) - getattr(before, f.name) for f in dataclasses.fields(self)})

    def copy(self) -> "ToolStats":
        return dataclasses.replace(self)


@dataclass
class ToolResult:
    """What one call produced: `text` is shown to the model; `ok` is False on a tool failure
    (outage or timeout); `error` names the kind ("bad_args", "rejected", "error", "timeout")."""

    text: str
    ok: bool = True
    error: str | None = None


JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


def _as_dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def unencodable(arguments: dict) -> str | None:
    """The name of the first argument holding a string (a key or a value, at any depth) that is
    not valid Unicode text, else None. Such a string has a lone surrogate: JSON's "\\ud800"
    escape decodes to one, and no UTF-8 encoder (an HTTP body, an MCP message) takes it."""
    for name, value in arguments.items():
        stack = [name, value]
        while stack:
            v = stack.pop()
            if isinstance(v, str):
                if not v.isascii():
                    try:
                        v.encode("utf-8")
                    except UnicodeEncodeError:
                        return name
            elif isinstance(v, dict):
                stack.extend(v)
                stack.extend(v.values())
            elif isinstance(v, (list, tuple)):
                stack.extend(v)
    return None


def check_arguments(schema: Any, arguments: Any) -> dict:
    """`arguments` checked against a function's JSON schema (object, properties, required,
    property types, additionalProperties=false); raises ToolArgumentError naming the problem,
    and nothing else whatever the schema: an MCP server sends any JSON as its schema, and a part
    this check cannot read (a boolean `true` subschema, a nested or unknown type, a
    `properties` that is not an object) is left to the tool to judge; a `false` subschema
    refuses its argument, as JSON Schema says."""
    if not isinstance(arguments, dict):
        raise ToolArgumentError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    schema = _as_dict(schema)
    props = _as_dict(schema.get("properties"))
    required = schema.get("required")
    missing = [k for k in required if isinstance(k, str) and k not in arguments] if isinstance(required, list) else []
    if missing:
        raise ToolArgumentError(f"missing required argument(s) {missing}")
    if schema.get("additionalProperties") is False:
        extra = sorted(set(arguments) - set(props))
        if extra:
            raise ToolArgumentError(f"unknown argument(s) {extra}; allowed: {sorted(props)}")
    for k, v in arguments.items():
        sub = props.get(k, True)
        if sub is False:
            raise ToolArgumentError(f"argument {k!r} is not allowed")
        want = _as_dict(sub).get("type")
        kinds = [want] if isinstance(want, str) else want if isinstance(want, list) else []
        if not kinds or not all(isinstance(kind, str) and kind in JSON_TYPES for kind in kinds):
            continue  # no type, or one this check cannot read: the tool judges
        types = tuple(t for kind in kinds for t in JSON_TYPES[kind])
        bool_bad = isinstance(v, bool) and "boolean" not in kinds  # JSON true is not a number
        if not isinstance(v, types) or bool_bad:
            raise ToolArgumentError(f"argument {k!r} must be {'/'.join(kinds)}, got {type(v).__name__}")
    return arguments


@dataclass
class Tool:
    """One callable tool. `fn(**arguments)` returns the text the model reads."""

    name: str
    description: str
    parameters: dict
    fn: Callable[..., Awaitable[str]]
    timeout_s: float = 120.0
    max_concurrency: int = 64
    failure_text: str | None = None
    """Shown when the tool fails (None: "Tool <name> failed: <why>.")."""
    fatal: tuple[type[BaseException], ...] = (ToolFatalError,)
    """Exceptions raised through `invoke` (every later call would fail the same way)."""
    stats: ToolStats = field(default_factory=ToolStats)
    _sem: asyncio.Semaphore | None = field(default=None, repr=False)
    _sem_loop: Any = field(default=None, repr=False)

    def _semaphore(self) -> asyncio.Semaphore:
        """One semaphore per tool (so concurrent rollouts share its limit), remade only when
        the tool is used from another event loop (a semaphore belongs to one loop)."""
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:
            self._sem, self._sem_loop = asyncio.Semaphore(self.max_concurrency), loop
        return self._sem

    def schema(self) -> dict:
        """The OpenAI/Hermes function schema chat templates render (`tools=[...]`)."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    async def invoke(self, arguments: Any) -> ToolResult:
        """Check, limit, time and count one call; never raises except ToolFatalError (and the
        caller's own cancellation)."""
        self.stats.calls += 1
        try:
            args = check_arguments(self.parameters, arguments)
        except ToolArgumentError as e:
            self.stats.bad_args += 1
            return ToolResult(f"Invalid arguments for tool {self.name}: {e}", ok=True, error="bad_args")
        bad = unencodable(args)
        if bad is not None:  # the model's input, refused before it reaches the tool (issue 83)
            self.stats.rejected += 1
            return ToolResult(f"Invalid input for tool {self.name}: argument {bad!r} is not valid text (it holds "
                              f"a lone surrogate such as \\ud800, half of a UTF-16 pair).", ok=True, error="rejected")
        async with self._semaphore():
            t0 = time.perf_counter()
            try:
                text = str(await _within(self.fn(**args), self.timeout_s))
            except self.fatal:
                raise
            except ToolInputError as e:
                self.stats.rejected += 1
                return ToolResult(str(e), ok=True, error="rejected")
            except (asyncio.TimeoutError, TimeoutError):
                self.stats.errors += 1
                self.stats.timeouts += 1
                log.warning("tool %s timed out after %g s (arguments %.80r)", self.name, self.timeout_s, args)
                return ToolResult(self.failure_text or f"Tool {self.name} failed: timed out after {self.timeout_s:g} s.",
                                  ok=False, error="timeout")
            # any failure of a tool is an error observation, a CancelledError of its own too (a
            # library's cancel scope); only the caller's cancellation goes through (its batch stops)
            except (Exception, asyncio.CancelledError) as e:  # noqa: BLE001
                if isinstance(e, asyncio.CancelledError) and asyncio.current_task().cancelling():
                    raise
                self.stats.errors += 1
                log.warning("tool %s failed (arguments %.80r): %.300r", self.name, args, e)
                return ToolResult(self.failure_text or f"Tool {self.name} failed: {type(e).__name__}.", ok=False, error="error")
            finally:
                self.stats.seconds += time.perf_counter() - t0
        return ToolResult(text)


async def _within(coro: Awaitable[Any], timeout_s: float) -> Any:
    """`await coro`, or TimeoutError after `timeout_s`. Unlike `asyncio.wait_for`, which waits
    for the cancelled call to end, a tool that swallows its cancellation is left to finish in
    the background instead of holding the rollout for as long as it likes."""
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    finally:
        if not task.done():
            task.cancel()
            task.add_done_callback(left_behind)
    if not done:
        raise TimeoutError
    return task.result()


def left_behind(task: asyncio.Future) -> None:
    """Done callback of a call given up on: its late outcome is nobody's, read here so asyncio
    does not warn that its exception was never retrieved."""
    if not task.cancelled():
        task.exception()


def tool_metrics(delta: dict[str, ToolStats]) -> dict[str, float]:
    """`tool/<name>/calls|errors|timeouts|bad_args|rejected|latency_mean_s` for one step."""
    out: dict[str, float] = {}
    for name, s in delta.items():
        out[f"tool/{name}/calls"] = float(s.calls)
        out[f"tool/{name}/errors"] = float(s.errors)
        out[f"tool/{name}/timeouts"] = float(s.timeouts)
        out[f"tool/{name}/bad_args"] = float(s.bad_args)
        out[f"tool/{name}/rejected"] = float(s.rejected)
        ran = s.calls - s.bad_args
        out[f"tool/{name}/latency_mean_s"] = s.seconds / ran if ran > 0 else 0.0
    return out


# ----------------------------------------------------------------------------- calculator
# Every operation is bounded before it runs: the calculator is synchronous, so a timeout cannot
# interrupt it (and a big-int operation holds the GIL). Integers grow only through **, * and
# round(x, -n) (which builds 10**n), so those check the size of their result first; no integer
# may exceed MAX_INT_BITS (about 1200 digits: far beyond any answer, under str()'s 4300-digit
# limit). Too large is the policy's input, refused as such (ToolInputError), not an outage.
MAX_EXPRESSION_CHARS = 200
MAX_INT_BITS = 4096
MAX_ROUND_DIGITS = 1000


def _bounded(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolInputError(f"result too large (more than {MAX_INT_BITS} bits, about 1200 digits)")
    if isinstance(value, complex):
        raise ToolInputError("the result is not a real number")
    return value


def _pow(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1 and (a.bit_length() - 1) * b > MAX_INT_BITS:
        raise ToolInputError(f"result too large (more than {MAX_INT_BITS} bits, about 1200 digits)")
    return a ** b


def _mul(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int) and a.bit_length() + b.bit_length() - 1 > MAX_INT_BITS:
        raise ToolInputError(f"result too large (more than {MAX_INT_BITS} bits, about 1200 digits)")
    return a * b


def _round(x: Any, ndigits: Any = None) -> Any:
    if ndigits is not None and (not isinstance(ndigits, int) or abs(ndigits) > MAX_ROUND_DIGITS):
        raise ToolInputError(f"round()'s digits must be an integer between -{MAX_ROUND_DIGITS} and {MAX_ROUND_DIGITS}")
    return round(x, ndigits)


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: _mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: _pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt, "log": math.log, "exp": math.exp, "abs": abs, "round": _round,
    "min": min, "max": max, "floor": math.floor, "ceil": math.ceil,
}
_CONSTS = {"pi": math.pi, "e": math.e}


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTS:
        return _CONSTS[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _bounded(_BINOPS[type(node.op)](_eval(node.left), _eval(node.right)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
            and not node.keywords):
        return _bounded(_FUNCS[node.func.id](*(_eval(a) for a in node.args)))
    raise ToolInputError(f"not allowed in an expression: {type(node).__name__}")


def calculate(expression: str) -> str:
    """The value of an arithmetic expression: numbers, + - * / // % **, parentheses, pi, e and
    sqrt log exp abs round min max floor ceil. Nothing else is evaluated (no names, attributes
    or calls beyond these), so the policy cannot run code through it; no operation's work or
    result can be large (see MAX_INT_BITS), so it returns at once whatever the input."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolInputError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
        value = _eval(tree)
    except ToolInputError:
        raise
    except SyntaxError:
        raise ToolInputError(f"not an arithmetic expression: {expression[:60]!r}") from None
    except (ArithmeticError, ValueError, TypeError, RecursionError, MemoryError) as e:
        raise ToolInputError(f"cannot evaluate {expression[:60]!r}: {e}") from None
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return str(value)


def calculator_tool(timeout_s: float = 5.0, max_concurrency: int = 64) -> Tool:
    async def calculator(expression: str) -> str:
        return calculate(expression)

    return Tool(
        name="calculator",
        description="Evaluate an arithmetic expression (+ - * / // % **, parentheses, sqrt, log, exp, "
                    "abs, round, min, max, floor, ceil, pi, e) and return its value.",
        parameters={"type": "object", "properties": {"expression": {"type": "string", "description":
                    "The expression, e.g. (1969 - 1879) * 2"}}, "required": ["expression"],
                    "additionalProperties": False},
        fn=calculator, timeout_s=timeout_s, max_concurrency=max_concurrency,
    )


def search_tool(fn: Callable[[str], Awaitable[str]], timeout_s: float = 120.0, max_concurrency: int = 64,
                failure_text: str | None = None, fatal: tuple[type[BaseException], ...] = (ToolFatalError,)) -> Tool:
    """The retriever as a tool: `fn(query) -> passages text` (the rollout manager supplies it;
    it raises ToolInputError for a query the server refused, a `fatal` error for a refused key)."""

    async def search(query: str) -> str:
        return await fn(query)

    return Tool(
        name="search",
        description="Search Wikipedia passages. Returns the top passages for the query.",
        parameters={"type": "object", "properties": {"query": {"type": "string", "description":
                    "What to look up, e.g. a name or a short question"}}, "required": ["query"],
                    "additionalProperties": False},
        fn=search, timeout_s=timeout_s, max_concurrency=max_concurrency, failure_text=failure_text, fatal=fatal,
    )


BUILTINS = ("search", "calculator")


async def _unconnected_search(query: str) -> str:
    raise RuntimeError("this search tool describes the schema only (no retriever connected)")


def builtin_tool(name: str) -> Tool:
    """A built-in tool by name, for its schema (search is not connected to a retriever here)."""
    if name == "search":
        return search_tool(_unconnected_search)
    if name == "calculator":
        return calculator_tool()
    raise ValueError(f"unknown built-in tool {name!r}; built-ins: {', '.join(BUILTINS)}")
