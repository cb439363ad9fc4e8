"""A small Dockerfile reader (no Docker engine needed) and the checks the image tests use.

Handles what pdfleet's Dockerfile uses: comments and parser directives, backslash
line continuations (comment lines inside them are dropped, as BuildKit does),
exec (JSON) and shell forms, global ARGs, named stages and FROM flags.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Instruction:
    cmd: str               # upper-case keyword: FROM, RUN, COPY, ...
    value: str             # the rest of the line, continuations joined
    line: int              # 1-based line where it starts

    @property
    def exec_form(self) -> Optional[list[str]]:
        """The JSON array of an exec-form RUN/CMD/ENTRYPOINT, else None."""
        text = self.value.strip()
        if not text.startswith("["):
            return None
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            return None
        return parsed if isinstance(parsed, list) and all(isinstance(x, str) for x in parsed) else None


@dataclass
class Stage:
    base: str
    name: Optional[str]
    line: int
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, cmd: str) -> list[Instruction]:
        return [i for i in self.instructions if i.cmd == cmd]

    def last(self, cmd: str) -> Optional[Instruction]:
        found = self.all(cmd)
        return found[-1] if found else None


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"no stage named {name!r}")

    def names(self) -> list[str]:
        return [s.name for s in self.stages if s.name]


def _logical_lines(text: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue  # comments (also inside continuations) and blank lines
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf.append(stripped[:-1].strip())
            continue
        buf.append(stripped)
        out.append((start, " ".join(p for p in buf if p)))
        buf = []
    if buf:
        out.append((start, " ".join(buf)))
    return out


def parse(text: str) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line, logical in _logical_lines(text):
        keyword, _, rest = logical.partition(" ")
        cmd = keyword.upper()
        rest = rest.strip()
        if cmd == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            base = words[0]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=base, name=name, line=line))
        elif not stages:
            if cmd != "ARG":
                raise ValueError(f"line {line}: {cmd} before the first FROM")
            key, has_default, default = rest.partition("=")
            if has_default:  # an ARG without a default stays unresolved
                global_args[key.strip()] = default.strip().strip('"')
        else:
            stages[-1].instructions.append(Instruction(cmd=cmd, value=rest, line=line))
    if not stages:
        raise ValueError("no FROM instruction")
    return Dockerfile(global_args=global_args, stages=stages)


# --- checks -------------------------------------------------------------------------

_EXACT_TAG = re.compile(r"^v?\d+\.\d+\.\d+([.-][A-Za-z0-9.-]+)?$")  # 3.11.13-slim-bookworm, v0.32.0
_DIGEST = re.compile(r"@sha256:[a-f0-9]{64}$")


def expand(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: args.get(m.group(1), m.group(0)), value)


def pin_problem(dockerfile: Dockerfile, stage: Stage) -> Optional[str]:
    """Why a stage's base is not pinned (None when it is, or when it is an earlier stage)."""
    earlier = {s.name for s in dockerfile.stages[: dockerfile.stages.index(stage)] if s.name}
    base = expand(stage.base, dockerfile.global_args)
    if base in earlier:
        return None
    if "$" in base:
        return f"{base}: unresolved build argument"
    if _DIGEST.search(base):
        return None
    name, _, tag = base.rpartition(":") if ":" in base.split("/")[-1] else (base, "", "")
    if not tag:
        return f"{base}: no tag (means latest)"
    if tag == "latest":
        return f"{base}: latest"
    if not _EXACT_TAG.match(tag):
        return f"{base}: tag {tag!r} is not an exact version"
    return None


def final_user(stage: Stage) -> Optional[str]:
    user = stage.last("USER")
    return user.value.strip() if user else None


def user_problem(stage: Stage) -> Optional[str]:
    """A user the kubelet can verify as non-root: numeric uid (and gid), not 0."""
    user = final_user(stage)
    if user is None:
        return "no USER (runs as root)"
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or (gid and not gid.isdigit()):
        return f"USER {user} is not numeric"
    if int(uid) == 0:
        return "USER is root"
    return None


def pip_installs(stage: Stage) -> list[list[str]]:
    """The argument lists of every `pip install` in a stage's RUN commands."""
    out = []
    for run in stage.all("RUN"):
        words = run.exec_form or shlex.split(run.value)
        command: list[str] = []
        for word in words + ["&&"]:
            if word in ("&&", ";", "||"):
                if "pip" in " ".join(command) and "install" in command:
                    out.append(command[command.index("install") + 1:])
                command = []
            else:
                command.append(word)
    return out


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore patterns exclude `path` (last match wins; `!` re-includes).

    A pattern that matches a directory also matches everything under it.
    """
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for raw in patterns:
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        regex = re.compile(
            "^" + "".join(
                ".*" if tok == "**" else "[^/]*" if tok == "*" else "[^/]" if tok == "?" else re.escape(tok)
                for tok in re.split(r"(\*\*|\*|\?)", pattern) if tok
            ).replace(".*/", "(.*/)?") + "$"
        )
        if any(regex.match(c) for c in candidates):
            excluded = not negate
    return excluded


__all__ = ["Dockerfile", "Instruction", "Stage", "expand", "final_user", "ignored", "parse",
           "pin_problem", "pip_installs", "user_problem"]
