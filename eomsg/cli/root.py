"""The ``eomsg`` command group: the global options every command takes, before its name
or after it, and usage errors said as every other error is — one line, ``Error: …``,
exit 2 — rather than as a box."""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param
from typer._param_types import coerce_cli_path
from typer.core import TyperArgument, TyperGroup, TyperOption

from eomsg.cli.common import Globals
from eomsg.cli.output import say
from eomsg.errors import ExitCode

BROKER_HELP = (
    "Talk to the node at unix://PATH, tcp://HOST:PORT or tls://HOST:PORT (env "
    "EOMSG_BROKER). Default: the node serving --data, if any, else the data directory "
    "in-process."
)
TLS_CA_HELP = (
    "The CA that signed the node's certificate, for tls:// (env EOMSG_TLS_CA; default: the "
    "system's). A client certificate, if the node asks for one: env EOMSG_TLS_CERT and "
    "EOMSG_TLS_KEY."
)
TOKEN_HELP = "The node's token, for TCP (env EOMSG_TOKEN; it is in DIR/eomsg.token)."
VIA_HELP = (
    "Talk to NODE, another node of the network, through the node reached (env EOMSG_VIA): "
    "the node that holds the queue to consume or look at."
)
INIT_HELP = (
    "Create the data directory if it does not exist (env EOMSG_INIT=1); without it only "
    "`eomsg serve` does, so a mistyped --data is an error, not a new directory."
)
CONTEXT_HELP = (
    "Reach the node as context NAME says (env EOMSG_CONTEXT; default: the one `eomsg "
    "context use` chose): its broker, token file and CA, unless given here."
)
NODE_NAME_HELP = (
    "The node's name among linked nodes (env EOMSG_NODE_NAME), as `eomsg serve "
    "--node-name`: what a data directory made now (--init) is named, or one opened here is "
    "renamed to while none of its links was made; a running node must have it."
)
# Commands that work on the data directory itself, never through a node (serve creates
# it; compact and salvage need one that exists).
OFFLINE = {"serve", "compact", "salvage"}
# What every other command takes.
CLIENT_GLOBALS = ("broker", "token", "tls_ca", "via", "init", "node_name", "context")


def _set(attribute: str) -> Any:
    def remember(ctx: Any, param: Any, value: Any) -> Any:
        if value is not None and ctx.get_parameter_source(param.name).name != "DEFAULT":
            setattr(Globals, attribute, value)
        return value

    return remember


def _as_command_option(root_option: Any) -> Any:
    """A copy of a root option for a command: no environment variable (the root read
    it), its value given to :class:`Globals`, none of its own for the command."""
    option = copy.copy(root_option)
    option.envvar, option.expose_value = None, False
    option.callback = _set(option.name)
    return option


_METAVARS = {
    "subscribe": "PATTERN",
    "topic": "PATTERN",
    "ttl": "DURATION",
    "ack_timeout": "DURATION",
    "abort_older_than": "DURATION",
    "header": "NAME=VALUE",
    "dead_letter": "QUEUE",
    "queue": "QUEUE",
    "interval": "SECONDS",
    "from_seq": "SEQ",
    "to_seq": "SEQ",
    "exec_": "COMMAND",
}


def _plain_help(param: Any) -> None:
    """Help that names values as Unix tools do — ``TOPIC``, ``[PAYLOAD]``, ``--ttl TTL``
    — rather than typer's ``{topic} <str>`` and ``--ttl <str>``."""
    if isinstance(param, TyperArgument):
        name = param.metavar = param.metavar or (param.name or "").upper()
        usage = name if param.required else f"[{name}]"
        param.display_type_rich = lambda ctx: None  # type: ignore[method-assign]
        param._usage_display_name = lambda: usage + ("..." if param.nargs != 1 else "")  # type: ignore[method-assign]
    elif isinstance(param, TyperOption) and not param.is_flag and param.metavar is None:
        name = param.name or ""
        param.metavar = _METAVARS.get(name) or ("N" if param.bare_type() == "int" else name.upper())


class _CoercedWhenGiven:
    """typer's coercion of one parameter, built only when the parameter has a value, and
    none at all for a text or a path: typer builds a pydantic adapter for each parameter
    of the command that runs (≈ 1.5 ms each, 25 for ``eomsg publish``, and pydantic's
    import, ≈ 60 ms, for the first), even for one left at None, which it then returns
    untouched (as here: ``()`` for one taking many values), and for a ``str``, which it
    returns as given."""

    def __init__(self) -> None:
        self._built: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        many = param.multiple or param.nargs == -1
        if value is None:
            return () if many else None
        plain = _without_pydantic(value, param, ctx, many)
        if plain is not _TYPERS:
            return plain
        if self._built is None:
            self._built = build_runtime_param(param.type_descriptor)
        return self._built.coerce(value, param=param, ctx=ctx)


_TYPERS = object()  # a value only typer's own coercion can give
_BOOLS = {
    **dict.fromkeys(("", "0", "off", "f", "false", "n", "no"), False),
    **dict.fromkeys(("1", "on", "t", "true", "y", "yes"), True),
}


def _without_pydantic(value: Any, param: Any, ctx: Any, many: bool) -> Any:
    """``value`` as typer's adapter would give it, where that is the value as given (a
    ``str``, each of a ``list[str]``, a default already of its type), ``Path(text)``
    under typer's own checks of a path, a flag's word from the environment, or
    ``int(digits)`` within the parameter's range;
    else ``_TYPERS``. tests/test_cli_habits.py holds each to typer's own result."""
    descriptor = param.type_descriptor
    info, annotation = descriptor.parameter_info, descriptor.annotation
    if info.parser is not None or descriptor.file_annotation is not None:
        return _TYPERS
    if many:
        texts = isinstance(value, list | tuple) and all(type(v) is str for v in value)
        return list(value) if texts and annotation == list[str] else _TYPERS
    if annotation is str and type(value) is str:
        return value
    if annotation is Path and info.path_type is None and isinstance(value, str | Path):
        try:
            return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
        except (ValueError, BadParameter):  # a NUL in it, unreadable, missing: typer's
            return _TYPERS  # adapter says so, naming the path as it was given
    if annotation is bool and type(value) is str:  # from the environment: EOMSG_INIT=1
        return _BOOLS.get(value.strip().lower(), _TYPERS)
    if (
        annotation is int
        and type(value) is str
        and value.isascii()
        and value.isdigit()
        and len(value) < 30
    ):
        value = int(value)
    if annotation in (int, float) and type(value) is annotation and not info.clamp:
        low, high = info.min, info.max
        in_range = (low is None or value >= low) and (high is None or value <= high)
        return value if in_range else _TYPERS
    return _TYPERS


def _coerce_when_given(command: Any) -> None:
    """Every parameter of ``command`` coerced by :class:`_CoercedWhenGiven`, including
    those typer adds as it parses (``--help``, the completion options)."""
    get_params = command.get_params

    def coerced(ctx: Any) -> list[Any]:
        params = get_params(ctx)
        for param in params:
            if isinstance(param, TyperArgument | TyperOption) and not isinstance(
                param._runtime_param, _CoercedWhenGiven
            ):
                param._runtime_param = _CoercedWhenGiven()  # type: ignore[assignment]
        return list(params)

    command.get_params = coerced


COMPLETION_SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")


def _completion_shell(words: list[str]) -> str | None:
    """The shell ``--show-completion SHELL`` or ``--install-completion SHELL`` names."""
    for i, word in enumerate(words):
        option, _, value = word.partition("=")
        if option in ("--show-completion", "--install-completion"):
            if value:
                return value
            following = words[i + 1] if i + 1 < len(words) else ""
            return following if following and not following.startswith("-") else None
    return None


def _leaves(group: TyperGroup) -> Iterator[tuple[str, Any]]:
    for name, command in group.commands.items():
        if isinstance(command, TyperGroup):
            yield from _leaves(command)
        else:
            yield name, command


def _commands(group: TyperGroup) -> Iterator[Any]:
    for command in group.commands.values():
        yield command
        if isinstance(command, TyperGroup):
            yield from _commands(command)


class EomsgGroup(TyperGroup):
    """The root group: gives every command that opens a data directory the global
    options, names arguments in capitals in help, and turns usage errors into one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        shared = [p for p in self.params if p.name in CLIENT_GLOBALS]
        for name, command in _leaves(self):
            for param in command.params:
                _plain_help(param)
            if any(p.name == "data" for p in command.params):
                ours = {p.name for p in command.params}
                wanted = [] if name in OFFLINE else CLIENT_GLOBALS
                extra = [
                    _as_command_option(p) for p in shared if p.name in wanted and p.name not in ours
                ]
                # before --json, which ends every command's own options
                at = next((i for i, p in enumerate(command.params) if p.name == "json"), None)
                at = len(command.params) if at is None else at
                command.params[at:at] = extra
        for command in _commands(self):
            _coerce_when_given(command)
        _coerce_when_given(self)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Run the command line; a usage error is ``Error: …`` on one line, exit 2."""
        standalone = kwargs.pop("standalone_mode", True)
        words = list(args[0] if args else kwargs.get("args") or sys.argv[1:])
        shell = _completion_shell(words)
        if shell is not None and shell not in COMPLETION_SHELLS:
            # typer would print (or install) bash's script for a shell it does not know
            say(f"Error: no completion for {shell!r}: {', '.join(COMPLETION_SHELLS)}", err=True)
            return self._exit(ExitCode.USAGE, standalone)
        if shell is not None and any(w.split("=")[0] == "--show-completion" for w in words):
            # typer's option is a flag: it would guess the shell from the processes above
            # this one (none is a shell under a service or a test) and ignore the one named
            from typer._completion_shared import get_completion_script

            script = get_completion_script(
                prog_name="eomsg", complete_var="_EOMSG_COMPLETE", shell=shell
            )
            sys.stdout.write(script + "\n")
            return self._exit(ExitCode.OK, standalone)
        try:
            code = super().main(*args, **{**kwargs, "standalone_mode": False})
        except typer.TyperException as e:  # click's ClickException: a usage error
            ctx = getattr(e, "ctx", None)
            if type(e).__name__ == "NoArgsIsHelpError" and ctx is not None:  # `eomsg queue`
                sys.stdout.write(ctx.get_help() + "\n")
                return self._exit(e.exit_code, standalone)
            where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            say(f"Error: {' '.join(e.format_message().split())}{where}", err=True)
            code = e.exit_code
        except typer.Abort:
            code = 130  # Ctrl-C at a prompt
        return self._exit(code, standalone)

    @staticmethod
    def _exit(code: Any, standalone: bool) -> Any:
        if not standalone:
            return code
        sys.exit(code if isinstance(code, int) else ExitCode.OK)
