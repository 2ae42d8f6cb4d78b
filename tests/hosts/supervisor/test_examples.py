"""The example supervisord.conf and berth.toml: valid for supervisord and for Berth, consistent
with each other, and shown verbatim in the README."""

from __future__ import annotations

from pathlib import Path

from berth.config import load

HERE = Path(__file__).resolve().parents[3] / "hosts" / "supervisor"
CONF = HERE / "examples" / "supervisord.conf"
TOML = HERE / "examples" / "berth.toml"


def _supervisord_config(tmp_path):
    """The example, parsed by supervisord's own option processing (log and run directories
    moved under ``tmp_path``, which supervisord requires to exist)."""
    (tmp_path / "log").mkdir()
    (tmp_path / "run").mkdir()
    text = CONF.read_text().replace("/var/log/supervisor", str(tmp_path / "log")).replace(
        "/run/", str(tmp_path / "run") + "/")
    conf = tmp_path / "supervisord.conf"
    conf.write_text(text)
    from supervisor.options import ServerOptions  # at use: each worker collects this module
    opts = ServerOptions()
    opts.configfile = str(conf)
    opts.process_config(do_usage=False)
    return {g.name: g for g in opts.process_group_configs}


def test_examples_agree_and_are_valid(tmp_path):
    groups = _supervisord_config(tmp_path)
    cfg = load(TOML)
    listener = groups["berth"]
    assert type(listener).__name__ == "EventListenerPoolConfig"
    assert {e.__name__ for e in listener.pool_events} == {"ProcessStateEvent", "Tick5Event"}
    assert listener.buffer_size > 10
    assert "supervisor listen" in listener.process_configs[0].command
    assert cfg.hosts.supervisor.url == "unix:///run/supervisor.sock"
    mapped = {name: e for name, e in cfg.engines.items() if e.supervisor}
    assert {e.mode for e in mapped.values()} == {"observe", "gate"}
    for name, entry in mapped.items():
        prog = groups[entry.supervisor].process_configs[0]
        assert prog.autostart is (entry.mode == "observe"), name   # gate: autostart=false
        assert prog.stopasgroup and prog.killasgroup, name
        assert entry.size


def test_readme_shows_the_examples_verbatim():
    readme = (HERE / "README.md").read_text()
    assert CONF.read_text() in readme
    assert TOML.read_text() in readme
