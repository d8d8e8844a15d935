"""Settings: documented defaults, strict loading, and messages that say what is wrong."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from evolver.config import SECTIONS, SURFACE, Config, ConfigError, load_config, render_config

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_repository_config_toml_is_the_documented_defaults():
    assert (REPO / "config.toml").read_text(encoding="utf-8") == render_config()


def test_every_setting_is_documented_and_the_file_loads_to_the_defaults():
    for name, model in SECTIONS.items():
        assert model.__doc__ and model.__doc__.strip().startswith(f"[{name}]")
        for key, field in model.model_fields.items():
            assert field.description, f"[{name}] {key} has no docstring"
    assert load_config(REPO / "config.toml", env={}).model_dump() == Config().model_dump()


def test_no_file_means_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    config = load_config(env={})
    assert config.source == "defaults"
    assert config.agent.observation_chars == 4000


def test_file_and_environment_overrides(tmp_path):
    path = write(tmp_path, '[model]\nname = "ollama/llama3.1"\n[agent]\nobservation_chars = 700\n')
    config = load_config(path, env={"EVOLVER_AGENT_OBSERVATION_CHARS": "900", "EVOLVER_MEMORY_FAST_QUERIES": "false"})
    assert config.model.name == "ollama/llama3.1"
    assert config.agent.observation_chars == 900  # the environment wins over the file
    assert config.memory.fast_queries is False
    assert config.source == str(path)


def test_evolver_config_variable_names_the_file(tmp_path):
    path = write(tmp_path, "[agent]\nobservation_chars = 999\n")
    assert load_config(env={"EVOLVER_CONFIG": str(path)}).agent.observation_chars == 999


def test_paths_follow_the_data_dir_setting(tmp_path):
    config = load_config(env={"EVOLVER_DAEMON_DATA_DIR": str(tmp_path / "d")})
    assert config.data_dir == tmp_path / "d"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[advanced.agent]\nmax_stepz = 2\n", ["unknown key 'max_stepz' in [advanced.agent]", "observation_chars"]),
        ("[model]\nnmae = 'x'\n", ["unknown key 'nmae' in [model]", "the keys of [model] are: name,"]),
        ("[agnt]\nmax_steps = 2\n", ["unknown section [agnt]", "[agent]"]),
        (
            "[advanced.agent]\nobservation_chars = 2.5\n",
            ["[advanced.agent] observation_chars = 2.5", "valid integer", "whole number >= 200 and <= 1000000"],
        ),
        (
            "[advanced.agent]\nobservation_chars = '900'\n",
            ["[advanced.agent] observation_chars = '900'", "whole number"],
        ),
        ("[agent]\nobservation_chars = 0\n", ["[agent] observation_chars = 0", "greater than or equal to 200"]),
        ("[model]\ntimeout_s = -1.0\n", ["[model] timeout_s = -1.0", "a number > 0"]),
        ("[sandbox]\nrequire_isolation = 'yes'\n", ["require_isolation", "true or false"]),
        ("[advanced.model]\nfallbacks = ['a', 2]\n", ["[advanced.model] fallbacks", "list of strings"]),
        ("[advanced.budget]\nusd_per_task = 10.0\n", ["[budget]", "usd_per_task exceeds usd_per_day"]),
        ("[advanced.daemon]\ntcp_port = 8080\n", ["[daemon]", "needs a token"]),
        ("[advanced.model]\nname = 'x'\n", ["[advanced.model] name is not an advanced setting: set it in [model]"]),
        (
            "[memory]\nrrf_k = 1\n[advanced.memory]\nrrf_k = 2\n",
            ["rrf_k is set in both [memory] and [advanced.memory]"],
        ),
        ("[advanced.nope]\nx = 1\n", ["unknown section [advanced.nope]", "[advanced.<section>]"]),
        ("advanced = 3\n", ["advanced must be a table of [advanced.<section>] tables"]),
        ("[agent\n", ["not valid TOML", "line 1"]),
        ("agent = 3\n", ["must be a [agent] table"]),
    ],
)
def test_bad_values_are_refused_naming_file_key_and_what_is_allowed(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    message = str(caught.value)
    assert message.startswith(str(path))
    for fragment in expected:
        assert fragment in message


def test_bad_environment_override_names_the_variable(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"environment variable EVOLVER_AGENT_OBSERVATION_CHARS: \[advanced.agent\] observation_chars = 0",
    ):
        load_config(env={"EVOLVER_AGENT_OBSERVATION_CHARS": "0"})


def test_a_variable_that_is_no_setting_never_stops_the_program(caplog):
    # The environment is shared: a name under EVOLVER_ that is no setting is another program's variable, or
    # the person's own token (the MCP recipe exports EVOLVER_MCP_TOKEN), left alone; one that looks like a
    # misspelt setting is named in a warning, with its value never shown.
    with caplog.at_level(logging.WARNING, logger="evolver.config"):
        config = load_config(
            env={
                "EVOLVER_MODEL_NAMEE": "x",
                "EVOLVER_TCP_TOKEN": "s3cret",
                "EVOLVER_MCP_TOKEN": "s3cret",
                "EVOLVER_NOPE_X": "1",
                "EVOLVER_AGENT": "2",
            }
        )
    assert config.model.name == "scripted/demo"
    assert [r.getMessage() for r in caplog.records] == [
        "environment variable EVOLVER_MODEL_NAMEE is not a setting and is ignored: [model] has no key 'namee' "
        "(did you mean EVOLVER_MODEL_NAME?)"
    ]


def test_a_variable_named_as_holding_a_secret_is_never_read_as_a_setting(tmp_path, caplog):
    # Even a name that is a setting's: the variable a setting or the command names holds a token, not a value.
    path = write(tmp_path, '[advanced.daemon]\ntcp_token_env = "EVOLVER_DAEMON_WORKERS"\n')
    with caplog.at_level(logging.WARNING, logger="evolver.config"):
        assert load_config(path, env={"EVOLVER_DAEMON_WORKERS": "s3cret"}).daemon.workers == 2
        from_env = load_config(env={"EVOLVER_MODEL_API_KEY_ENV": "EVOLVER_MODEL_NAME", "EVOLVER_MODEL_NAME": "k"})
        assert from_env.model.name == "scripted/demo"
        named = load_config(
            env={"EVOLVER_AGENT_KEEP_WORKSPACES": "s3cret"}, secret_variables={"EVOLVER_AGENT_KEEP_WORKSPACES"}
        )
        assert named.agent.keep_workspaces is False
    assert not caplog.records


def test_a_missing_explicit_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "absent.toml", env={})


def test_an_old_file_with_a_retired_key_still_loads_and_says_why_it_is_ignored(tmp_path, caplog):
    old = tmp_path / "config.toml"
    old.write_text("[model]\nmax_tokens_step = 700\nmax_tokens_chat = 512\n")  # as an older `config init` wrote
    with caplog.at_level(logging.WARNING, logger="evolver.config"):
        config = load_config(old, env={})
    assert config.model.max_tokens_step == 700 and not hasattr(config.model, "max_tokens_chat")
    assert [r.getMessage() for r in caplog.records] == [
        f"{old}: [model] max_tokens_step has moved to [advanced.model] (an advanced setting); it is read from "
        "[model] for this release",
        f"{old}: [model] max_tokens_chat is no longer a setting and is ignored: a chat turn's replies are capped "
        "by [advanced.model] max_tokens_step, as a task's are; remove it",
    ]


def test_an_old_file_that_chose_worker_threads_loads_and_says_they_are_gone(tmp_path, caplog):
    old = write(tmp_path, "[advanced.daemon]\nworker_processes = false\n")
    with caplog.at_level(logging.WARNING, logger="evolver.config"):
        config = load_config(old, env={})
    assert not hasattr(config.daemon, "worker_processes")
    assert [r.getMessage() for r in caplog.records] == [
        f"{old}: [advanced.daemon] worker_processes is no longer a setting and is ignored: the agent workers always "
        "run in processes of their own beside the daemon (worker threads inside the daemon are gone); remove it"
    ]


def test_an_old_file_with_moved_keys_loads_them_and_names_their_new_place(tmp_path, caplog):
    old = write(tmp_path, "[memory]\nrrf_k = 30\n[daemon]\nworkers = 3\nlease_s = 60.0\n")  # before [advanced]
    with caplog.at_level(logging.WARNING, logger="evolver.config"):
        config = load_config(old, env={})
    assert (config.memory.rrf_k, config.daemon.workers, config.daemon.lease_s) == (30, 3, 60.0)
    assert [r.getMessage() for r in caplog.records] == [
        f"{old}: [memory] rrf_k has moved to [advanced.memory] (an advanced setting); it is read from [memory] "
        "for this release",
        f"{old}: [daemon] lease_s has moved to [advanced.daemon] (an advanced setting); it is read from [daemon] "
        "for this release",
    ]


def test_advanced_keys_are_read_from_their_tables_and_the_environment_names_them_as_before(tmp_path, caplog):
    path = write(tmp_path, "[daemon]\nworkers = 3\n[advanced.daemon]\nlease_s = 60.0\n[advanced.memory]\nrrf_k = 30\n")
    with caplog.at_level(logging.WARNING, logger="evolver.config"):
        config = load_config(path, env={"EVOLVER_MEMORY_RRF_K": "40"})
    assert (config.daemon.workers, config.daemon.lease_s, config.memory.rrf_k) == (3, 60.0, 40)
    assert not caplog.records


def test_the_settings_a_person_sets_are_twenty_keys_at_most_and_head_the_documented_file(caplog):
    assert sum(len(keys) for keys in SURFACE.values()) <= 20
    assert all(key in SECTIONS[section].model_fields for section, keys in SURFACE.items() for key in keys)
    surface, _, _ = render_config().partition("\n[advanced.")
    top = {line.split(" = ")[0] for line in surface.splitlines() if re.match(r"^[a-z_]+ = ", line)}
    assert top == {key for keys in SURFACE.values() for key in keys} - {"servers"}  # [[mcp.servers]]: tables
    with caplog.at_level(logging.WARNING, logger="evolver.config"):
        load_config(REPO / "config.toml", env={})
    assert not caplog.records  # the documented file puts every key in its place
