from __future__ import annotations

import pytest

from server.settings import Settings, SettingsError


def test_defaults_match_the_product() -> None:
    s = Settings.from_env({})
    assert (s.data_dir, s.host, s.port, s.fsync) == ("./dq-data", "127.0.0.1", 8080, "always")
    assert s.max_batch == 1000 and s.max_value_bytes == 1 << 20 and s.tokens == ()
    assert s.body_limit > s.max_batch * s.max_value_bytes  # a full batch of base64 values fits


def test_environment_and_flags() -> None:
    env = {
        "DQ_PORT": "9000", "DQ_FSYNC": "interval", "DQ_TOKENS": "a, b,,c", "DQ_SHM": "yes",
        "DQ_MAX_BODY_BYTES": "1234", "DQ_SHM_SPIN_US": "10", "HOME": "/x",
    }  # fmt: skip
    s = Settings.from_env(env)
    assert (s.port, s.fsync, s.tokens, s.shm, s.body_limit) == (
        9000,
        "interval",
        ("a", "b", "c"),
        True,
        1234,
    )
    assert s.extra == {"shm_spin_us": "10"}
    t = s.replace(port=None, host="0.0.0.0", fsync="never")
    assert (t.port, t.host, t.fsync) == (9000, "0.0.0.0", "never")


@pytest.mark.parametrize(
    "env",
    [{"DQ_PORT": "eighty"}, {"DQ_FSYNC": "sometimes"}, {"DQ_MAX_BATCH": "0"}, {"DQ_SHM": "maybe"}],
)
def test_bad_values_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        Settings.from_env(env)
