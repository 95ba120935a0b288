"""A mistake gets a sentence: configuration and start-up errors print one line and exit 2, a
mistyped data dir is named instead of silently created, ``serve`` refuses to be an open proxy for
a server-held key, and the ``listening`` line never shows a URL's password."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import msgspec
import pytest

from projectionist.proxy.ops.serve import is_loopback, open_proxy_refusal
from projectionist.proxy.config import load_config
from tests.backends import free_port, free_port_pair
from tests.commands import cli
from tests.paths import ROOT


def one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("projectionist: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


BAD_CONFIGS = [  # (file text, what the one line must name)
    ("[server]\nport = 8787\nhost = \n", "line 3"),                 # TOML syntax
    ("[server\nport = 1\n", "line 1"),                                 # TOML syntax
    ("[server]\nunknown_key = true\n", "unknown_key"),                 # unknown key
    ("[store]\nread_timeout = \"slow\"\n", "read_timeout"),            # wrong type
    ("[server]\nport = -1\n", "port"),                                 # negative port
    ("[server]\nport = 70000\n", "port"),                              # out of range
    ("[upstreams.x]\nformat = \"openai\"\nurl = \"ftp://h\"\n", "url"),  # not http(s)
    ("[upstreams.\"a b\"]\nformat = \"openai\"\nurl = \"http://h\"\n", "a b"),  # not a routable name
    ("server = 3\n", "server"),                                        # a table that is not one
    ("[server]\nclient_max_size = -5\n", "client_max_size"),           # negative sizes and durations
    ("[store.limits]\nmax_bytes = 0\n", "max_bytes"),
    ("[cache]\nmax_bytes = -1\n", "max_bytes"),
    ("[record]\nmax_response_bytes = -1\n", "max_response_bytes"),
    ("[store]\nread_timeout = 0\n", "read_timeout"),
]


@pytest.mark.parametrize(("text", "named"), BAD_CONFIGS, ids=range(len(BAD_CONFIGS)))
async def test_a_bad_config_file_is_one_line_and_exit_2(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    rc, _, err = await cli("serve", "--config", str(path), "--data-dir", str(tmp_path / "d"))
    one_line_error(rc, err, "INVALID_CONFIG", named)


async def test_a_missing_config_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    rc, _, err = await cli("serve", "--config", str(tmp_path / "nope.toml"))
    one_line_error(rc, err, "INVALID_CONFIG", "nope.toml")


@pytest.mark.parametrize("port", ["-1", "65536", "99999"])
async def test_a_port_out_of_range_on_the_command_line_is_one_line(tmp_path: Path, port: str) -> None:
    rc, _, err = await cli("serve", "--port", port, "--data-dir", str(tmp_path / "d"))
    one_line_error(rc, err, "INVALID_CONFIG", "--port:")  # the flag, not $.server.port


EXPLAINED = [  # (file text, what the one line must say: the file's line, the key, what would be right)
    ("[server]\nhost = \"127.0.0.1\"\nprot = 9\n", [":3:", "`server.prot`", "did you mean `port`?"]),
    ("[logging]\nlevel = \"loud\"\n", [":2:", "`logging.level`", "valid values: 'debug', 'info', 'warning', 'error'"]),
    ("[upstreams.x]\nformat = \"opnai\"\nurl = \"http://h\"\n",
     [":2:", "`upstreams.<name>.format`", "'openai', 'anthropic', 'gemini'"]),
    ("# a comment\n[serverr]\nport = 1\n", [":2:", "`serverr`", "did you mean `server`?"]),
]


@pytest.mark.parametrize(("text", "said"), EXPLAINED, ids=range(len(EXPLAINED)))
async def test_a_config_mistake_names_its_file_line_key_and_the_right_spelling(tmp_path: Path, text: str,
                                                                               said: list[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    rc, _, err = await cli("serve", "--config", str(path), "--data-dir", str(tmp_path / "d"))
    one_line_error(rc, err, "INVALID_CONFIG", str(path))
    for needle in said:
        assert needle in err, (needle, err)


async def test_a_port_in_use_is_one_line_and_nothing_claims_to_listen(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port_pair()))  # the console's port + 1 free: the port is what fails
        taken.listen()
        port = taken.getsockname()[1]
        rc, _, err = await cli("serve", "--port", str(port), "--data-dir", str(tmp_path / "d"))
    assert '"listening"' not in err
    one_line_error(rc, err, "LISTEN_FAILED", str(port))


async def test_the_consoles_port_in_use_is_one_line_naming_the_console(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, _, err = await cli("serve", "--port", str(free_port()), "--admin-listen", f"127.0.0.1:{port}",
                               "--data-dir", str(tmp_path / "d"))
    assert '"listening"' not in err
    one_line_error(rc, err, "LISTEN_FAILED", str(port), "console")


async def test_a_malformed_admin_listen_names_the_flag(tmp_path: Path) -> None:
    for value in ("8788", "host:99999", "a b:1"):
        rc, _, err = await cli("serve", "--admin-listen", value, "--data-dir", str(tmp_path / "d"))
        one_line_error(rc, err, "INVALID_CONFIG", "admin.listen")


async def test_the_listening_line_names_the_consoles_own_address_port_plus_one() -> None:
    port = free_port_pair()
    line = await serve_briefly(port=port)
    assert line["port"] == port and line["admin"] == f"127.0.0.1:{port + 1}"


@pytest.mark.parametrize("verb", [["events", "s"], ["quarantine", "s"], ["recover", "s", "sha256:" + "0" * 64],
                                  ["fork", "s", "t"], ["replay", "--session", "s"]])
async def test_admin_verbs_name_an_empty_data_dir_and_create_nothing(tmp_path: Path, verb: list[str]) -> None:
    typo = tmp_path / "dataa"
    rc, out, err = await cli(*verb, "--data-dir", str(typo))
    one_line_error(rc, err, "EMPTY_DATA_DIR", str(typo))
    assert out == "" and not typo.exists()


def test_open_proxy_rule() -> None:
    keyed = {"OPENAI_KEY": "sk-server"}
    config = load_config(None, **{"server.host": "0.0.0.0",
                                  "upstreams.openai": {"format": "openai", "url": "https://api.openai.com",
                                                       "api_key_env": "OPENAI_KEY"}})
    refusal = open_proxy_refusal(config, keyed)
    assert refusal is not None and "openai" in refusal and "--insecure-open-proxy" in refusal
    assert open_proxy_refusal(config, {**keyed, "PROJECTIONIST_CLIENT_TOKENS": "t1"}) is None
    # no server-held key: clients bring their own, but images and sessions are data all the same
    unkeyed = open_proxy_refusal(config, {})
    assert unkeyed is not None and "read every image and session" in unkeyed and "openai" not in unkeyed
    local = load_config(None, **{"server.host": "127.0.0.1"})
    assert open_proxy_refusal(msgspec.structs.replace(config, server=local.server), keyed) is None
    assert [is_loopback(h) for h in ("127.0.0.1", "127.5.0.1", "::1", "[::1]", "localhost", "0.0.0.0", "", "::",
                                      "10.0.0.1", "example.com")] == [True] * 5 + [False] * 5


async def test_serve_refuses_to_be_an_open_proxy_unless_told(tmp_path: Path) -> None:
    env = {**os.environ, "OPENAI_KEY": "sk-server-held"}
    env.pop("PROJECTIONIST_CLIENT_TOKENS", None)
    config = tmp_path / "c.toml"
    config.write_text('[upstreams.openai]\nformat = "openai"\nurl = "http://127.0.0.1:9"\napi_key_env = "OPENAI_KEY"\n')
    rc, _, err = await cli("serve", "--config", str(config), "--host", "0.0.0.0", "--port", str(free_port()),
                           "--data-dir", str(tmp_path / "d"), env=env)
    one_line_error(rc, err, "OPEN_PROXY_REFUSED", "--insecure-open-proxy")
    assert "sk-server-held" not in err
    log = await serve_briefly("--config", str(config), "--host", "0.0.0.0", "--insecure-open-proxy",
                              "--data-dir", str(tmp_path / "d"), env=env)
    assert log["open_proxy"] is True


async def test_serve_refuses_an_open_listener_even_without_a_server_held_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PROJECTIONIST_CLIENT_TOKENS"}
    rc, _, err = await cli("serve", "--host", "0.0.0.0", "--port", str(free_port()),
                           "--data-dir", str(tmp_path / "d"), env=env)
    one_line_error(rc, err, "OPEN_PROXY_REFUSED", "--insecure-open-proxy")
    log = await serve_briefly("--host", "0.0.0.0", "--data-dir", str(tmp_path / "d"),
                              env={**env, "PROJECTIONIST_CLIENT_TOKENS": "t1"})
    assert log["open_proxy"] is False


async def test_an_api_key_env_that_is_not_set_is_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_SUCH_KEY_VAR"}
    config = tmp_path / "c.toml"
    config.write_text('[upstreams.openai]\nformat = "openai"\nurl = "http://127.0.0.1:9"\n'
                      'api_key_env = "NO_SUCH_KEY_VAR"\n')
    rc, _, err = await cli("serve", "--config", str(config), "--port", str(free_port()),
                           "--data-dir", str(tmp_path / "d"), env=env)
    one_line_error(rc, err, "INVALID_CONFIG", "$NO_SUCH_KEY_VAR")
    assert "openai" in err
    log = await serve_briefly("--config", str(config), "--data-dir", str(tmp_path / "d"),
                              env={**env, "NO_SUCH_KEY_VAR": "sk-set"})
    assert log["event"] == "listening"


async def serve_briefly(*args: str, env: dict[str, str] | None = None, port: int | None = None) -> dict[str, object]:
    """Start ``serve`` on ``port`` (a free one, and so is the next, for its console unless ``args``
    put it elsewhere), return its ``listening`` line, stop it with SIGTERM."""
    port = port if port is not None else free_port_pair()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "projectionist.proxy.ops.cli", "serve", "--port", str(port), *args, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    try:
        line = await asyncio.wait_for(proc.stderr.readline(), 30)
        entry: dict[str, object] = msgspec.json.decode(line)
        assert entry["event"] == "listening", line
        return entry
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 15)


async def test_the_listening_line_never_shows_a_url_password(tmp_path: Path) -> None:
    log = await serve_briefly("--upstream", "openai=http://alice:hunter2@127.0.0.1:9/v1",
                              "--upstream", "vllm=openai:http://tok3n@127.0.0.1:9", "--data-dir", str(tmp_path / "d"))
    text = msgspec.json.encode(log).decode()
    assert "hunter2" not in text and "alice" not in text and "tok3n" not in text
    assert log["upstreams"] == {"openai": "http://***@127.0.0.1:9/v1", "anthropic": "https://api.anthropic.com",
                                "gemini": "https://generativelanguage.googleapis.com", "vllm": "http://***@127.0.0.1:9"}


async def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"[server]\nhost = \"caf\xe9\"\n")
    rc, _, err = await cli("serve", "--config", str(path))
    one_line_error(rc, err, "INVALID_CONFIG", "UTF-8")


async def test_a_data_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    afile = tmp_path / "not-a-dir"
    afile.write_text("x")
    rc, _, err = await cli("serve", "--port", "0", "--data-dir", str(afile))
    one_line_error(rc, err, "STARTUP_FAILED", str(afile))


async def test_a_log_that_cannot_be_opened_at_startup_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[log]\npath = "/proc/no-such-dir/sessions.sqlite3"\n')
    rc, _, err = await cli("serve", "--port", "0", "--config", str(config), "--data-dir", str(tmp_path / "d"))
    one_line_error(rc, err, "LOG_UNAVAILABLE")


async def test_a_bad_upstream_flag_never_echoes_a_url_password(tmp_path: Path) -> None:
    rc, _, err = await cli("serve", "--upstream", "openai=ftp://user:SECRETPW@h", "--data-dir", str(tmp_path / "d"))
    assert rc == 2 and "SECRETPW" not in err and "--upstream" in err


def test_the_refusal_says_when_client_tokens_are_switched_off() -> None:
    config = load_config(None, **{"server.host": "0.0.0.0", "server.client_tokens_env": "",
                                  "upstreams.openai": {"format": "openai", "url": "https://api.openai.com",
                                                       "api_key": "sk-held"}})
    refusal = open_proxy_refusal(config, {})
    assert refusal is not None and "client_tokens_env is empty" in refusal and "($)" not in refusal


BACKENDS_WITHOUT_EXTRA = [  # (config text, the driver taken away, the extra the line must name)
    ("[store]\nkind = \"s3\"\n[store.s3]\nbucket = \"b\"\nendpoint = \"http://127.0.0.1:1\"\n", "aiobotocore", "s3"),
    ("[log]\nkind = \"postgres\"\n[log.postgres]\ndsn = \"postgresql://127.0.0.1:1/x\"\n", "asyncpg", "postgres"),
]


@pytest.mark.parametrize(("text", "driver", "extra"), BACKENDS_WITHOUT_EXTRA, ids=["s3", "postgres"])
def test_a_backend_without_its_extra_is_one_line_naming_it(tmp_path: Path, text: str, driver: str, extra: str) -> None:
    """The base install carries neither backend's driver; serve names the extra to install."""
    import subprocess

    path = tmp_path / "c.toml"
    path.write_text(text)
    program = (f"import sys; sys.modules[{driver!r}] = None\n"  # as if never installed: import and find_spec fail
               "from projectionist.proxy.ops.cli import main\n"
               f"sys.exit(main(['serve', '--config', {str(path)!r}, '--data-dir', {str(tmp_path / 'd')!r}, '--port', '0']))")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=ROOT)
    one_line_error(done.returncode, done.stderr, "MISSING_EXTRA", f"pip install -e '.[{extra}]'", driver)
