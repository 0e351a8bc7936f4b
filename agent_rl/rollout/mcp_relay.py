"""The relay between a stdio MCP server's stdout and the SDK (see agent_rl/rollout/mcp_tools.py):

    python -I -S mcp_relay.py MAX_ITEMS MAX_VALUES MAX_LIST_VALUES MAX_BYTES -- command...

It starts `command` (which inherits its stdin and stderr) and passes each line of its stdout on,
bounded, so that what the SDK parses on the client's event loop is small; the cost of parsing
is paid here, in a process of its own. Run as a file with the standard library only (-I -S: no
site, no package imports), so it starts in milliseconds.

- a call's answer keeps its first MAX_ITEMS content items (then a text item counting the rest);
- a message of more than MAX_VALUES JSON values (a tool list: MAX_LIST_VALUES) becomes an
  error answer to its request;
- a call's answer over MAX_BYTES keeps the head of each text item, any other message over it
  is an error answer (dropped if its id cannot be read);
- a line is held HELD_LINES times MAX_BYTES at most: a longer one is read on to its end in
  pieces and dropped, answered as an error when its head names its id (issue 100);
- a line that is not JSON is dropped (as the SDK would);
- a notification (a message without "id") is dropped: the client reads none, and a server
  sending them without pause cost its event loop for each (issue 100); their number goes to
  stderr once a second as `[relay] dropped N notification(s)`, which the client counts;
- when it ends (the server's stdout closed, or SIGTERM from the client's shutdown), every process
  the server started is killed, also one that left the process group (setsid) and ignores
  SIGTERM: the relay is their subreaper (Linux; elsewhere such a helper may outlive it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

HELD_LINES = 4  # a line of up to HELD_LINES * MAX_BYTES is read whole (then cut to its head)
PIECE_BYTES = 1 << 20  # the rest of a longer line is read and dropped this much at a time
NOTE_EVERY_S = 1.0  # the count of dropped notifications goes to stderr at most this often
DROPPED = "[relay] dropped {} notification(s)"  # the client reads this line: mcp_tools._StderrTap
HEAD_ID = re.compile(rb'\A\s*\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,200}")\s*,')
"""The id at the head of a line too long to hold, as JSON-RPC libraries write it (jsonrpc, id first)."""


def values(msg, limit):
    n, stack = 0, [msg]
    while stack and n <= limit:
        v = stack.pop()
        n += 1
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return n


def error_answer(msg_id, why):
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": -32603, "message": f"the answer holds {why}"}}


def error(msg, why):
    if not (isinstance(msg, dict) and "id" in msg and ("result" in msg or "error" in msg)):
        sys.stderr.write(f"[relay] a message with {why}, dropped\n")
        return None
    return error_answer(msg["id"], why)


def shorter(msg, size, max_bytes):
    # a call's answer keeps the head of each text item (an observation reads far less); any
    # other message over max_bytes (a 10 MB schema) is an error answer to its request
    content = (msg.get("result") or {}).get("content") if isinstance(msg, dict) else None
    if isinstance(content, list):
        room = max_bytes // (2 * max(1, len(content)))
        for item in content:
            if isinstance(item, dict) and isinstance(item.get("text"), str) and len(item["text"]) > room:
                item["text"] = item["text"][:room] + f" [cut at {room} of {len(item['text'])} characters]"
        if len(json.dumps(msg)) <= max_bytes:
            return msg
    return error(msg, f"{size} bytes, more than the client reads ({max_bytes})")


def bounded(line, max_items, max_values, max_list_values, max_bytes):
    """`line` as it goes on to the client, or None (dropped)."""
    # a value is the first, or follows "[", "," or ":": fewer of those than max_items, nothing to cap
    if len(line) <= max_bytes and line.count(b",") + line.count(b":") + line.count(b"[") < max_items:
        return line
    try:
        msg = json.loads(line.decode("utf-8", "replace"), strict=False)
    except (ValueError, RecursionError):
        sys.stderr.write(f"[relay] a line of {len(line)} bytes that is not JSON, dropped\n")
        return None
    result = msg.get("result") if isinstance(msg, dict) else None
    content = result.get("content") if isinstance(result, dict) else None
    changed = isinstance(content, list) and len(content) > max_items
    if changed:
        note = {"type": "text", "text": f"[{len(content) - max_items} more content items not shown]"}
        result["content"] = content[:max_items] + [note]
    limit = max_list_values if isinstance(result, dict) and "tools" in result else max_values
    if values(msg, limit) > limit:
        msg, changed = error(msg, f"more than {limit} JSON values, more than the client reads"), True
    elif len(line) > max_bytes:
        msg, changed = shorter(msg, len(line), max_bytes), True
    if msg is None:
        return None
    return (json.dumps(msg) + "\n").encode() if changed else line


def lines(stream, held):
    """The lines of `stream`, each `held` bytes at most: a longer one is read to its end (a
    piece at a time, never whole) and given as the error answer its head's id names, or None."""
    while line := stream.readline(held + 1):
        if len(line) <= held or line.endswith(b"\n"):
            yield line
            continue
        size, head = len(line), line[:4096]
        del line
        while piece := stream.readline(PIECE_BYTES):
            size += len(piece)
            if piece.endswith(b"\n"):
                break
        found = HEAD_ID.match(head)
        why = f"a line of more than {held} bytes ({size}), more than the client holds"
        if found is None:
            sys.stderr.write(f"[relay] {why}, dropped\n")
            yield None
        else:
            yield (json.dumps(error_answer(json.loads(found.group(1)), why)) + "\n").encode()


def is_notification(line):
    # every answer and request holds "id"; a notification (no id) is for handlers the client
    # does not have. Checked on the bytes: a flood costs this process little, the client nothing
    return b'"id"' not in line and b'"method"' in line


def adopt_orphans():
    """Become the child subreaper (Linux prctl): a helper the server starts that leaves its process
    group (setsid) and outlives its parent is then our child, not init's, and `end_descendants`
    finds it; the SDK's shutdown signals our process group only (issue 100)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):  # not Linux: helpers that leave the group may outlive the server
        pass


def children():
    """The pids whose parent is this process (read from /proc; none where there is no /proc)."""
    me, found = os.getpid(), []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == me:
                        found.append(int(name))
            except (OSError, ValueError, IndexError):
                pass
    return found


def end_descendants(deadline_s=2.0):
    """SIGKILL our children until none is left: each one's own children are ours when it dies."""
    stop = time.monotonic() + deadline_s
    while time.monotonic() < stop:
        alive = children()
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        if not alive:
            return
        time.sleep(0.01)


def main(argv):
    max_items, max_values, max_list_values, max_bytes = map(int, argv[1:5])
    command = argv[6:]
    adopt_orphans()
    # the SDK's shutdown: stdin closed, then SIGTERM to our group, then SIGKILL; at SIGTERM
    # (a helper may hold the server's stdout open, so no EOF comes) we end every descendant
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, bufsize=1 << 20)
    except OSError as e:
        sys.exit(f"cannot start {command[0]!r}: {e}")
    try:
        relay(child, max_items, max_values, max_list_values, max_bytes)
    finally:
        end_descendants()
    sys.exit(child.returncode if child.returncode is not None else 0)


def relay(child, max_items, max_values, max_list_values, max_bytes):
    """Pass `child`'s stdout on, bounded, until it ends; then wait for the child."""
    dropped, noted_at, out = 0, time.monotonic(), sys.stdout.buffer
    try:
        for line in lines(child.stdout, HELD_LINES * max_bytes):
            if line is not None and is_notification(line):
                dropped += 1
                line = None
            elif line is not None:
                line = bounded(line, max_items, max_values, max_list_values, max_bytes)
            if line is not None:
                out.write(line)
                out.flush()
            if dropped and time.monotonic() - noted_at >= NOTE_EVERY_S:
                sys.stderr.write(DROPPED.format(dropped) + "\n")
                sys.stderr.flush()
                dropped, noted_at = 0, time.monotonic()
    except BrokenPipeError:
        pass
    if dropped:
        sys.stderr.write(DROPPED.format(dropped) + "\n")
    child.wait()


if __name__ == "__main__":
    main(sys.argv)
