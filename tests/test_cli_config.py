"""`tidegate config check [FILE]`: the file and the environment through the processes' own loader;
the effective settings printed as TOML with secrets redacted, or one line per error naming the
setting's path and exit status 2."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel, Field, SecretStr, ValidationError
from typer.testing import CliRunner

from tidegate.cli.config import settings_toml, validation_errors
from tidegate.cli.main import app
from tidegate.config import TidegateConfig

EXAMPLE = Path(__file__).resolve().parent.parent / "tidegate.example.toml"

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_tidegate_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the variables a test sets itself reach the loader."""
    for name in list(os.environ):
        if name.upper().startswith("TIDEGATE_"):
            monkeypatch.delenv(name)


def _section(printed: str, header: str) -> list[str]:
    """The lines of one `[header]` table of the printed TOML."""
    lines = printed.splitlines()
    start = lines.index(header) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("[")), len(lines))
    return lines[start:end]


def test_the_example_passes_and_its_print_loads_back_as_the_same_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = runner.invoke(app, ["config", "check", str(EXAMPLE)])

    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    # The check left the process's own configuration as it was
    assert "TIDEGATE_CONFIG" not in os.environ
    # The print is TOML, and read as a configuration it is the settings that were checked
    printed = tmp_path / "printed.toml"
    printed.write_text(result.stdout)
    tomllib.loads(result.stdout)
    monkeypatch.setenv("TIDEGATE_CONFIG", str(EXAMPLE))
    checked = TidegateConfig.load()
    monkeypatch.setenv("TIDEGATE_CONFIG", str(printed))
    assert TidegateConfig.load() == checked


def test_a_bad_file_exits_2_with_one_line_per_error_naming_the_setting(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[gateway]\nport = 70000\n\n[worker]\nconcurency = 4\n\n[recs]\ndimension = 0\n")

    result = runner.invoke(app, ["config", "check", str(bad)])

    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "error: recs.dimension: Input should be greater than or equal to 1, not 0",
        "error: worker.concurency: no such setting (see tidegate.example.toml)",
        "error: gateway.port: Input should be less than or equal to 65535, not 70000",
    ]


@pytest.mark.parametrize(("text", "expected"), [
    ("[gateway\nport = 1\n", "not valid TOML"),
    ('[[providers]]\nname = "x"\n', "providers.0.base_url: Field required"),
    ("[budgets]\non_exhausted = \"later\"\n", "budgets.on_exhausted: Input should be 'defer'"),
])
def test_each_kind_of_mistake_is_one_line(tmp_path: Path, text: str, expected: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)

    result = runner.invoke(app, ["config", "check", str(bad)])

    assert result.exit_code == 2
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_variable_that_is_not_json_is_named() -> None:
    result = runner.invoke(app, ["config", "check", str(EXAMPLE)], env={"TIDEGATE_SYNC__TABLES": "[oops"})

    assert result.exit_code == 2
    assert result.stderr.startswith("error: environment: TIDEGATE_SYNC__TABLES is not valid JSON")


def test_a_file_that_does_not_exist_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["config", "check", str(tmp_path / "nope.toml")])

    assert result.exit_code == 2
    assert "nope.toml: no such file" in result.stderr


def test_the_environment_overrides_the_file_and_is_marked(tmp_path: Path) -> None:
    result = runner.invoke(app, ["config", "check", str(EXAMPLE)],
                           env={"TIDEGATE_GATEWAY__PORT": "9123", "TIDEGATE_WORKER__CONCURRENCY": "3"})

    assert result.exit_code == 0, result.output
    assert "port = 9123  # env" in _section(result.stdout, "[gateway]")
    assert "concurrency = 3  # env" in _section(result.stdout, "[worker]")
    assert "port = 8080  # file" in _section(result.stdout, "[up]")


def test_without_a_file_the_defaults_and_the_environment_are_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # no tidegate.toml here

    result = runner.invoke(app, ["config", "check"], env={"TIDEGATE_GATEWAY_PORT": "9124"})

    assert result.exit_code == 0, result.output
    assert "no file (tidegate.toml not found)" in result.stdout
    # The spelling from before [gateway] was a section counts as the environment too
    assert "port = 9124  # env" in _section(result.stdout, "[gateway]")


def test_passwords_in_urls_are_redacted(tmp_path: Path) -> None:
    config = tmp_path / "tidegate.toml"
    config.write_text('queue_url = "redis://:s3cret@127.0.0.1:6399/0"\n')

    result = runner.invoke(app, ["config", "check", str(config)],
                           env={"TIDEGATE_SYNC__SOURCE_URL": "postgresql://shop:hunter2@db:5432/shop"})

    assert result.exit_code == 0, result.output
    assert "s3cret" not in result.output and "hunter2" not in result.output
    assert 'queue_url = "redis://:***@127.0.0.1:6399/0"  # file' in result.stdout
    assert 'source_url = "postgresql://shop:***@db:5432/shop"  # env' in _section(result.stdout, "[sync]")


def test_a_bad_url_value_is_redacted_in_the_error_too(tmp_path: Path) -> None:
    result = runner.invoke(app, ["config", "check", str(EXAMPLE)],
                           env={"TIDEGATE_TRACING__SAMPLE_RATIO": "2", "TIDEGATE_SYNC__SLOT": "postgres://u:pw@h/BAD"})

    assert result.exit_code == 2
    assert ":pw@" not in result.stderr and "'postgres://u:***@h/BAD'" in result.stderr
    assert "sync.slot: String should match pattern" in result.stderr
    assert "tracing.sample_ratio: Input should be less than or equal to 1, not '2'" in result.stderr


def test_the_admin_key_is_redacted_and_marked_as_from_the_environment() -> None:
    key = "tg_0123456789ab_" + "s3cretsecretsecretsecret"

    result = runner.invoke(app, ["config", "check", str(EXAMPLE)], env={"TIDEGATE_ADMIN_KEY": key})

    assert result.exit_code == 0, result.output
    assert "s3cret" not in result.output
    assert 'admin_key = "***"  # env' in _section(result.stdout, "[up]")


def test_an_error_never_repeats_a_secrets_value() -> None:
    class Keyed(BaseModel):
        admin_key: str = Field(pattern="^tg_")

    with pytest.raises(ValidationError) as refused:
        Keyed(admin_key="s3cret-with-a-typo")

    assert validation_errors(refused.value) == ["admin_key: String should match pattern '^tg_'"]


class _WithSecret(BaseModel):
    name: str = "ops"
    token: SecretStr = SecretStr("tg_verysecret")


def test_a_secret_setting_is_redacted() -> None:
    lines = list(settings_toml(_WithSecret()))

    assert lines == ['name = "ops"', 'token = "***"']


def test_a_provider_without_its_key_variable_is_a_warning_not_an_error(tmp_path: Path) -> None:
    config = tmp_path / "tidegate.toml"
    config.write_text('[[providers]]\nname = "openai"\nbase_url = "https://api.openai.com/v1"\n'
                      'api_key_env = "TIDEGATE_TEST_UNSET_KEY"\n'
                      '[[providers.models]]\nname = "gpt-4.1"\ninput_usd_per_1m = "2.00"\n'
                      'output_usd_per_1m = "8.00"\n')

    result = runner.invoke(app, ["config", "check", str(config)])

    assert result.exit_code == 0, result.output
    assert "[[providers]]" in result.stdout and "[[providers.models]]" in result.stdout
    assert 'input_usd_per_1m = "2.00"  # file' in result.stdout
    assert "warning: providers.0.api_key_env: TIDEGATE_TEST_UNSET_KEY is not set" in result.stderr
