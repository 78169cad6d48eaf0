"""What the coordinator reads from its processes' logs: the last lines of one (``log_tail``, for an error message),
the lines appended since the last look (``LogTail``), the ServerApp's log records (``LOG_LINE``) and the SuperLink's
refusals to activate a SuperNode (``ActivationRefusals``), as ``serve_experiment`` (``fedseg.flower.launch``) shows
them on the console while a run goes on.
"""

from __future__ import annotations

import re
from pathlib import Path


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text[-lines:])


LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+: (.*)$")  # server.log format


class LogTail:
    """Lines appended to a file since the last call."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        return data[:end].decode(errors="replace").splitlines()


ACTIVATION_REFUSED = re.compile(  # superlink.log: a refused activation, with the public key and the cause
    r"activate-node\]\[ApiError:\d+\] .*public key: (.*?), exception: (.*)$"
)
NODE_ALREADY_ON = re.compile(r"SuperNode with node ID (\d+) could not be activated")
KEY_UNKNOWN = "No SuperNode found with the given public key"


ACTIVATION_LINES_MOST = 20  # distinct refusals said on the console (an attack sent a new key each time: 106 in 8 s)


class ActivationRefusals:
    """The SuperLink's refusals to activate a SuperNode, from its log (from ``offset``: the bytes an earlier
    coordinator in the same ``--out`` wrote), as one console line each: the SuperNode is told only "Failed to activate
    SuperNode" (``fedseg.flower.supernode_main.ExplainActivation``); the coordinator says which cause it was and, for
    a registered key, whose. Each node (registered key) or unregistered key is said once (a SuperNode restarted
    every few seconds by systemd is refused as often); another cause is said as the SuperLink gives it; after
    :data:`ACTIVATION_LINES_MOST` such lines, one line says no more are said."""

    def __init__(self, log: Path, node_sites: dict[str, str], offset: int = 0) -> None:
        self.tail, self.node_sites, self.said = LogTail(log), node_sites, set[str]()
        self.said_enough = False  # the line saying that no more are said
        self.tail.offset = offset

    def new_lines(self) -> list[str]:
        lines = []
        for line in self.tail.new_lines():
            if not (m := ACTIVATION_REFUSED.search(line)):
                continue
            key, cause = m.group(1), m.group(2).strip().rstrip(".")
            if already := NODE_ALREADY_ON.search(cause):
                node = already.group(1)
                site = self.node_sites.get(node)
                whose = f"site {site!r}'s key" if site else "a registered key"
                said = (
                    f"a SuperNode with {whose} (node id {node}) was refused: the SuperNode of that key is connected "
                    "(a second process with its key?), or stopped without saying goodbye less than a minute ago "
                    "(the SuperLink counts it online until then: it may start again after that)"
                )
                key = node
            elif cause == KEY_UNKNOWN:
                said = f"a SuperNode whose key is not registered (--auth-keys) was refused: {cause}"
            else:
                said = f"the SuperLink refused to activate a SuperNode: {cause}"
                key = cause
            if key in self.said:
                continue
            if len(self.said) >= ACTIVATION_LINES_MOST:  # keys drawn by the thousand: a flood, not a hospital
                if not self.said_enough:
                    self.said_enough = True
                    lines.append(
                        f"more SuperNodes were refused activation ({ACTIVATION_LINES_MOST} said here already): no "
                        "further line here for them (superlink.log counts them)"
                    )
                continue
            self.said.add(key)
            lines.append(said)
        return lines
