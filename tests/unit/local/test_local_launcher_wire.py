"""The launcher's wire (operator/local/launcher.py): frames are bounded before they are read, requests are
checked field by field, and only `python -m <the imported module>` commands go to it."""

from __future__ import annotations

import os
import signal

import pytest

from pdfleet.operator.local.launcher import (
    HEADER,
    MAX_FRAME,
    FrameError,
    FrameReader,
    common_env,
    encode,
    module_args,
    parse_start,
    returncode,
)

MODULE = "vllm.entrypoints.openai.api_server"
GOOD = {"op": "start", "id": 7, "module": MODULE, "args": ["--port", "1"], "env": {"A": "b"}, "cwd": "/tmp",
        "log": "/tmp/x.log"}


def test_frames_round_trip_whole_and_byte_by_byte():
    msgs = [{"ready": True, "pid": 12}, {"id": 1, "pid": 13}, {"exit": 13, "returncode": -15}]
    stream = b"".join(encode(m) for m in msgs)
    assert FrameReader().feed(stream) == msgs
    reader, out = FrameReader(), []
    for i in range(len(stream)):
        out += reader.feed(stream[i:i + 1])
    assert out == msgs


def test_an_oversized_length_is_refused_before_its_body_arrives():
    reader = FrameReader(max_frame=100)
    with pytest.raises(FrameError, match="101 bytes is over the 100-byte bound"):
        reader.feed(HEADER.pack(101))  # the header alone: nothing of the body is waited for or read
    assert FrameReader(max_frame=100).feed(HEADER.pack(100)) == []  # at the bound: waits for the body


def test_encode_refuses_a_message_over_the_bound():
    with pytest.raises(FrameError, match="over the"):
        encode({"env": {"X": "y" * MAX_FRAME}})
    assert len(encode({"env": {"X": "y" * 1000}})) < MAX_FRAME


@pytest.mark.parametrize("body, why", [
    (b"not json", "not JSON"),
    (b"[1, 2]", "JSON list, not an object"),
    (b'"text"', "JSON str, not an object"),
])
def test_a_frame_must_be_one_json_object(body, why):
    with pytest.raises(FrameError, match=why):
        FrameReader().feed(HEADER.pack(len(body)) + body)


@pytest.mark.parametrize("change, field", [
    ({"op": "exec"}, "op"),
    ({"id": "7"}, "id"),
    ({"id": True}, "id"),
    ({"module": "os"}, "module"),  # only the module the launcher imported
    ({"args": "--port 1"}, "args"),
    ({"args": ["--port", 1]}, "args"),
    ({"env": ["A=b"]}, "env"),
    ({"env": {"A": 1}}, "env"),
    ({"cwd": "relative/dir"}, "cwd"),
    ({"log": None}, "log"),
])
def test_start_requests_are_checked_field_by_field(change, field):
    assert parse_start(GOOD, MODULE).args == ("--port", "1")  # the control: the unchanged request passes
    with pytest.raises(FrameError, match=f"^{field}:"):
        parse_start({**GOOD, **change}, MODULE)


@pytest.mark.parametrize("argv, args", [
    (("/py", "-m", MODULE, "--port", "1"), ("--port", "1")),
    (("/py", "-m", MODULE), ()),
    (("/py", "-m", "other.module", "--port", "1"), None),
    (("/py", "script.py", "-m", MODULE), None),
    (("/py",), None),
])
def test_only_python_dash_m_of_the_module_goes_to_the_launcher(argv, args):
    assert module_args(argv, MODULE) == args


def test_the_launcher_imports_under_what_every_engine_shares():
    envs = [{"A": "1", "PORT": "10", "B": "x"}, {"A": "1", "PORT": "11"}, {"A": "1", "PORT": "12", "B": "x"}]
    assert common_env(envs) == {"A": "1"}
    assert common_env([{"A": "1"}]) == {"A": "1"}
    assert common_env([]) == {}


def test_wait_statuses_read_as_popen_returncodes():
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    assert returncode(os.waitpid(pid, 0)[1]) == 3
    pid = os.fork()
    if pid == 0:
        os.kill(os.getpid(), signal.SIGKILL)
        os._exit(0)
    assert returncode(os.waitpid(pid, 0)[1]) == -signal.SIGKILL
